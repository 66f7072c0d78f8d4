"""The wheel users install, not the editable checkout: its package list, its import names, and a whole
migration run from it in a fresh virtual environment with only the `qdrant` and `files` extras."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from reindex import registry

# One worker builds the wheel and its virtual environment once for the module (under -n, each worker that
# runs a test of it would build its own: 30 s each).
pytestmark = pytest.mark.xdist_group("wheel")

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"reindex": "reindex", "reindex_adapters": "adapters"}  # import name -> folder in the tree


def declared_packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(config["tool"]["setuptools"]["packages"])


def tree_packages() -> set[str]:
    found = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join((name, *relative.parts)))
    return found


def registered_modules() -> set[str]:
    """Every module the registry names: kinds (built-in and entry points), ledgers, engines, probes."""
    values = [value for role in ("source", "embedder", "target") for value in registry.kinds(role).values()]
    values += [*registry.LEDGERS.values(), *registry.ENGINES.values(), registry.BACKENDS_PROBE]
    return {value.partition(":")[0] for value in values}


def test_every_package_in_the_tree_is_declared_for_the_wheel() -> None:
    """A sub-package left out of the list is left out of the wheel (bedrock and gemini once were)."""
    assert declared_packages() == tree_packages()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the files git would commit, so no build/ or egg-info lands in the checkout."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = out.glob("reindex_embeddings-*.whl")
    return path


def test_the_wheel_holds_every_registered_module_and_claims_only_reindex_names(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    files = {name for name in names if ".dist-info/" not in name}
    top_level = {name.split("/")[0].removesuffix(".py") for name in files}
    assert top_level == {"reindex", "reindex_adapters"}
    assert all(name.startswith("reindex") for name in top_level)
    for module in sorted(registered_modules()):
        path = module.replace(".", "/")
        assert f"{path}.py" in files or f"{path}/__init__.py" in files, f"{module} is not in the wheel"
    assert {"reindex/py.typed", "reindex_adapters/py.typed"} <= files
    top_level_txt = next((n for n in names if n.endswith(".dist-info/top_level.txt")), None)
    if top_level_txt is not None:
        declared = zipfile.ZipFile(wheel).read(top_level_txt).decode().split()
        assert all(name.startswith("reindex") for name in declared), declared


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment (not the dev one) with the wheel and its `qdrant` and `files` extras."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, f"{wheel}[qdrant,files]"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return home


def reindex(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(home / "bin" / "reindex"), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def test_the_installed_wheel_resolves_every_kind_whose_extra_it_has(installed: Path, tmp_path: Path) -> None:
    """Every registered module imports from the wheel (adapters import their SDKs lazily), and the kinds
    whose extra was installed build from a config; outside the checkout, so nothing is read from the tree."""
    script = (
        "import importlib, json\n"
        "from reindex import registry\n"
        "values = [v for r in ('source', 'embedder', 'target') for v in registry.kinds(r).values()]\n"
        "values += [*registry.LEDGERS.values(), *registry.ENGINES.values(), registry.BACKENDS_PROBE]\n"
        "failed = {}\n"
        "for value in values:\n"
        "    module, _, name = value.partition(':')\n"
        "    try:\n"
        "        getattr(importlib.import_module(module), name) if name else importlib.import_module(module)\n"
        "    except Exception as exc:\n"
        "        failed[value] = repr(exc)\n"
        "offers = [registry.source_offers(), registry.target_offers(), registry.embedder_offers()]\n"
        "failed |= {k: 'no offer' for k in set(registry.SOURCES) - set(offers[0])}\n"
        "values = [offer.survey for offer in offers[0].values()]\n"
        "for value in values:\n"
        "    module, _, name = value.partition(':')\n"
        "    try:\n"
        "        getattr(importlib.import_module(module), name)\n"
        "    except Exception as exc:\n"
        "        failed[value] = repr(exc)\n"
        "import reindex, reindex_adapters\n"
        "print(json.dumps({'failed': failed, 'files': [reindex.__file__, reindex_adapters.__file__]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(installed / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] == {}
    assert all(str(installed) in path for path in result["files"]), result["files"]


def test_a_whole_migration_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(40))
    )
    config = tmp_path / "docs.toml"
    config.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n[embedder]\nkind = "hash"\ndim = 16\n\n'
        f'[target]\nkind = "qdrant"\npath = "{tmp_path / "qdrant"}"\nalias = "docs"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\nshard_size = 10\n'
    )
    outputs = {}
    for command in ("plan", "run", "verify", "cutover"):
        done = reindex(installed, command, "-c", str(config), "--json", cwd=tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        outputs[command] = json.loads(done.stdout)
    assert outputs["plan"]["documents"] == 40
    assert outputs["verify"]["complete"] is True
