"""A plugin or script that names a 0.1 module path gets its 0.2 path as the fix, not a traceback."""

from __future__ import annotations

import pytest

from reindex import registry
from reindex.errors import ConfigError


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("adapters.memory", "reindex_adapters.testing.memory"),
        ("adapters.openai_emulator", "reindex_adapters.testing.emulators.openai"),
        ("adapters.postgres_ledger", "reindex_adapters.postgres.ledger"),
        ("adapters.azure_openai", "reindex_adapters.openai.azure"),
        ("adapters.ray_engine", "reindex.run.ray"),
    ],
)
# (Paths whose folder still exists, such as adapters.postgres, would import from a checkout's root, which
# pytest puts on sys.path; an installed wheel has no `adapters` package at all.)
def test_an_old_module_path_names_its_new_one(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    monkeypatch.setitem(registry.EMBEDDERS, "legacy", f"{old}:Embedder")
    with pytest.raises(ConfigError) as raised:
        registry.resolve("embedder", "legacy")
    assert f"names the module {old!r}" in str(raised.value)
    assert repr(new) in (raised.value.hint or "")
    assert registry.moved_to(old) == new


def test_a_module_that_never_existed_points_at_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.EMBEDDERS, "broken", "reindex_adapters.no_such_module:Embedder")
    with pytest.raises(ConfigError) as raised:
        registry.resolve("embedder", "broken")
    assert "check the plugin's entry point" in (raised.value.hint or "")
