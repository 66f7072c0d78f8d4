"""Hugging Face model folders and tokenizers, shared by the local embedders (sentence-transformers, vLLM):
where a model's files are, what digests its weights, and the tokenizer as the embedders count with it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reindex.errors import ConfigError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

WEIGHT_SUFFIXES = (".safetensors", ".bin")
SKIPPED_DIRS = {"onnx", "openvino"}  # alternative runtimes' exports: not the weights torch loads


@contextmanager
def loading_errors(model: str) -> Iterator[None]:
    """huggingface_hub, transformers and safetensors raise OSError/ValueError/RuntimeError: make them ours."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        where = "not found locally" if not Path(model).exists() else "could not be loaded"
        raise ConfigError(
            f"model {model!r} {where}: {type(exc).__name__}",
            hint="pass a local model directory or pre-download it into the Hugging Face cache",
        ) from exc


def model_dir(name: str) -> Path:
    if Path(name).is_dir():
        return Path(name)
    from huggingface_hub import snapshot_download

    with loading_errors(name):
        return Path(snapshot_download(name, local_files_only=True))


def weights_digest(directory: Path) -> str:
    """sha256 over the weight files torch loads (name and bytes), in a stable order."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.suffix in WEIGHT_SUFFIXES and path.is_file() and not SKIPPED_DIRS & set(relative.parts):
            digest.update(relative.as_posix().encode() + b"\0")
            _hash_file(digest, path)
    return digest.hexdigest()


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)


def untruncated(backend: Tokenizer) -> Tokenizer:
    """A copy of the backend without the truncation/padding a tokenizer.json may carry."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def special_count(backend: Tokenizer) -> int:
    processor = backend.post_processor
    return 0 if processor is None else int(processor.num_special_tokens_to_add(False))
