"""Loading a sentence-transformers model: torch and the device, the model and its fast tokenizer, the token
limit it accepts, and its identity (the weights digest, pooling and modules its fingerprint hashes)."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from reindex.errors import ConfigError, MissingDependency
from reindex.fingerprint import fingerprint
from reindex.ports import EmbedderInfo
from reindex_adapters.hub import loading_errors, model_dir, weights_digest

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

Device = Literal["cpu", "cuda", "auto"]
Precision = Literal["fp32", "bf16", "fp16"]
HUB_CHECK_S = 10.0  # one request to the hub before a model that is not here is downloaded


def import_torch() -> Any:
    try:
        import sentence_transformers  # noqa: F401
        import torch
    except ImportError:
        raise MissingDependency("sentence-transformers", extra="sentence-transformers") from None
    return torch


def resolve_device(torch: Any, device: Device, precision: Precision) -> str:
    has_cuda = bool(torch.cuda.is_available())
    if device == "cuda" and not has_cuda:
        raise ConfigError("device 'cuda' requested but CUDA is not available", hint="use 'auto' or 'cpu'")
    resolved = "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"
    if resolved == "cpu" and precision == "fp16":
        raise ConfigError("precision 'fp16' is not offered on CPU", hint="use 'fp32' or 'bf16' on CPU")
    return resolved


def load(model: str, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # our own progress goes to stderr; theirs would interleave
    _locate(model)
    with loading_errors(model):
        return SentenceTransformer(model, device=device, local_files_only=_offline() or Path(model).exists())


def _locate(model: str) -> None:
    """Fail at once, in one line, for a model that is neither a folder here nor in the Hugging Face cache and
    that the hub cannot give: offline, unreachable or unknown there. Without this, the hub client retries
    for more than a minute before the same answer (a typo in a folder name read as a hub name)."""
    if Path(model).exists():
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid hub name either
        cached = None
    if isinstance(cached, str):
        return
    here = f"no model folder at {Path(model).absolute()}, and {model!r} is not in the Hugging Face cache"
    if _offline():
        raise ConfigError(f"{here} (HF_HUB_OFFLINE is set)", hint="give the folder of a saved model")
    from huggingface_hub import model_info
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        model_info(model, timeout=HUB_CHECK_S)
    except (RepositoryNotFoundError, HFValidationError):
        raise ConfigError(
            f"{here} nor on the Hugging Face hub", hint="check the name or the folder"
        ) from None
    except Exception as exc:  # connection refused, DNS, timeout, a proxy: all mean unreachable
        raise ConfigError(
            f"{here}, and the Hugging Face hub cannot be reached ({type(exc).__name__})",
            hint="download the model where there is a network and give its folder, or set HF_ENDPOINT",
        ) from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}


def _tokenizer(model: SentenceTransformer, name: str) -> Any:
    tokenizer = getattr(model[0], "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"model {name!r} has no fast (tokenizers) text tokenizer",
            hint="use a model that ships tokenizer.json",
        )
    return tokenizer


def _max_tokens(model: SentenceTransformer, tokenizer: Any, requested: int | None, specials: int) -> int:
    ceiling = _position_limit(model, tokenizer)
    limit = requested or model.max_seq_length or ceiling
    if limit > ceiling or limit <= specials:
        raise ConfigError(
            f"max_tokens {limit} is outside what the model accepts ({specials + 1}..{ceiling})",
            hint=f"set max_tokens to at most {ceiling}",
        )
    return limit


def _position_limit(model: SentenceTransformer, tokenizer: Any) -> int:
    transformer: Any = model[0]
    limits = [
        getattr(transformer.auto_model.config, "max_position_embeddings", None),
        tokenizer.init_kwargs.get("model_max_length"),
        model.max_seq_length,
    ]
    return min(value for value in limits if isinstance(value, int) and 0 < value < 1_000_000)


def _full_dim(model: SentenceTransformer, name: str) -> int:
    dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = dimension()
    if not isinstance(dim, int):
        raise ConfigError(
            f"model {name!r} does not report its embedding dimension", hint="use a text encoder"
        )
    return dim


def truncation(model: SentenceTransformer, name: str, truncate_dim: int | None) -> int | None:
    """`truncate_dim` as given, where the model's vectors are at least that long; ConfigError otherwise."""
    full = _full_dim(model, name)
    if truncate_dim is not None and truncate_dim > full:
        raise ConfigError(
            f"truncate_dim {truncate_dim} is more than model {name!r} gives ({full} dimensions)",
            hint=f"set [embedder] truncate_dim to at most {full}, or remove it",
        )
    return truncate_dim


def _info(model: SentenceTransformer, name: str, limit: int, **choices: Any) -> EmbedderInfo:
    dim = choices.get("truncate_dim") or _full_dim(model, name)
    options = {
        "weights": weights_digest(model_dir(name)),
        "pooling": _pooling(model),
        "modules": [type(module).__name__ for module in model],
        "max_tokens": limit,
        **choices,
    }
    identity = Path(name).name if Path(name).exists() else name  # the weights digest pins the files
    return EmbedderInfo(
        kind="sentence-transformers",
        model=name,
        dim=dim,
        max_tokens=limit,
        fingerprint=fingerprint("sentence-transformers", identity, dim, options),
        options=options,
    )


def identity_key(name: str, choices: dict[str, Any]) -> str | None:
    """A digest of what the model's `info` depends on, read without loading it: `choices`, every file of
    its folder by path, size and modification time, and the versions of the libraries that read them. None
    for a hub model not downloaded yet."""
    directory = Path(name) if Path(name).is_dir() else _downloaded(name)
    if directory is None:
        return None
    files = sorted(
        (path.relative_to(directory).as_posix(), stat.st_size, stat.st_mtime_ns)
        for path in directory.rglob("*")
        if path.is_file() and (stat := path.stat())
    )
    versions: dict[str, str | None] = {}
    for package in ("sentence-transformers", "transformers", "reindex-embeddings"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    canonical = json.dumps([name, choices, files, versions], sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _downloaded(name: str) -> Path | None:
    """The folder a hub model was downloaded to, without asking the hub; None where it is not here."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not downloaded, a name that is no repo id: the full load says which
        return None


def _pooling(model: SentenceTransformer) -> str:
    for module in model.children():
        describe = getattr(module, "get_config_dict", dict)
        config: dict[str, Any] = describe()
        if "pooling_mode" in config:
            return str(config["pooling_mode"])
        modes = [
            key.removeprefix("pooling_mode_")
            for key, on in config.items()
            if key.startswith("pooling_mode_") and on is True
        ]
        if modes:
            return "+".join(modes)
    return "none"
