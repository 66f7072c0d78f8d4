"""Config loading: shipped examples validate; mistakes name the section and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from reindex.config import load
from reindex.errors import ConfigError

CONFIGS = sorted(
    p for p in (Path(__file__).parent.parent / "configs").glob("*.toml") if p.name != "pricing.toml"
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    config = load(path)
    assert config.alias


def test_there_are_shipped_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ("shard_size = 0", "[run] shard_size"),
        ("too_long = 'drop'", "[run] too_long"),
        ("colour = 'red'", "[run] unknown key 'colour'"),
    ],
)
def test_run_section_errors_name_the_key(tmp_path: Path, run: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[source]\nkind = "jsonl"\npath = "x"\n[embedder]\nkind = "hash"\n'
        f'[target]\nkind = "memory"\nalias = "docs"\n[run]\n{run}\n'
    )
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(path)


def test_unknown_section_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[source]\nkind = "jsonl"\npath = "x"\n[embeder]\nkind = "hash"\n')
    with pytest.raises(ConfigError, match="unknown section"):
        load(path)


def test_an_unknown_kind_is_offered_the_real_kinds_not_the_test_doubles(tmp_path: Path) -> None:
    from reindex import registry
    from reindex.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        registry.resolve("embedder", "sentence-transformer")
    hint = refused.value.hint or ""
    assert "sentence-transformers" in hint and "openai" in hint
    assert "hash" not in hint.split(", ") and "memory-batch" not in hint and "paced" not in hint
