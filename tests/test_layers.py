"""The layers in pyproject.toml's [tool.importlinter] hold, and no module is part of an import cycle.

lint-imports checks the contracts. Its acyclic_siblings contract sees cycles between sibling modules and
packages only, not a package's __init__ importing a module that imports the package back, so the cycle
test here looks at every module. Both count the imports made only under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reindex", "reindex_adapters")


def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        *PACKAGES, include_external_packages=False, exclude_type_checking_imports=False, cache_dir=None
    )


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    upstream = {module: graph.find_upstream_modules(module) for module in graph.modules}
    components = {
        frozenset({module} | {other for other in above if module in upstream[other]})
        for module, above in upstream.items()
    }
    return sorted(sorted(component) for component in components if len(component) > 1)


def test_the_import_contracts_hold() -> None:
    script = Path(sys.executable).with_name("lint-imports")  # `python -m importlinter.cli` runs nothing
    assert script.is_file(), f"no lint-imports beside {sys.executable}: install the dev extra"
    done = subprocess.run(
        [sys.executable, str(script), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_no_module_is_part_of_an_import_cycle() -> None:
    assert import_cycles(import_graph()) == []


def test_a_cycle_through_a_package_init_is_found() -> None:
    graph = import_graph()
    graph.add_import(importer="reindex.init.proposal", imported="reindex.init")  # InitRequest's old home
    assert ["reindex.init", "reindex.init.proposal"] in import_cycles(graph)


def contract(contract_id: str) -> dict[str, Any]:
    import tomllib

    contracts: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]["contracts"]
    return next(c for c in contracts if c["id"] == contract_id)


# shared by several backends, so not one of the independent ones (mistral_tokens: the emulator counts with it too)
SHARED_KIT = {"remote", "hub", "devices", "mistral_tokens"}


def test_every_backend_is_under_the_runtime_and_independence_contracts() -> None:
    """A backend folder added later is held by both contracts without anyone remembering to list it."""
    folder = ROOT / "adapters"
    children = {
        path.stem
        for path in folder.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    runtime = {name.removeprefix("reindex_adapters.") for name in contract("runtime")["source_modules"]}
    backends = {name.removeprefix("reindex_adapters.") for name in contract("backends")["modules"]}
    assert runtime == children - {"testing"}
    assert backends == runtime - SHARED_KIT
