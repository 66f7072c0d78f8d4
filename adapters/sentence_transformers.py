"""Local embedder on sentence-transformers: tokenize once with the model's fast tokenizer, embed the ids."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reindex.errors import ConfigError, MissingDependency
from reindex.fingerprint import fingerprint
from reindex.ports import EmbedderInfo, Tokens, Vectors

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Encoding, Tokenizer

Device = Literal["cpu", "cuda", "auto"]
Precision = Literal["fp32", "bf16", "fp16"]
WEIGHT_SUFFIXES = (".safetensors", ".bin")
SKIPPED_DIRS = {"onnx", "openvino"}  # alternative runtimes' exports: not the weights torch loads


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU or CUDA, fed with token ids the core has already batched."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["sentence-transformers"]
        model: str
        normalize: bool = True
        prompt: str = ""
        max_tokens: int | None = Field(default=None, gt=0)
        device: Device = "auto"
        precision: Precision = "fp32"
        batch_tokens: int | None = Field(default=None, gt=0)  # padded tokens per call; None: by device
        threads: int | None = Field(default=None, gt=0)

    def __init__(
        self,
        model: str,
        *,
        normalize: bool = True,
        prompt: str = "",
        max_tokens: int | None = None,
        device: Device = "auto",
        precision: Precision = "fp32",
        batch_tokens: int | None = None,
        threads: int | None = None,
    ) -> None:
        torch = _import_torch()
        if threads:
            torch.set_num_threads(threads)
        self.device = _resolve_device(torch, device, precision)
        self.model = _load(model, self.device)
        self.normalize, self.prompt = normalize, prompt
        # Measured on 2 CPU cores: 512-4096 tokens per call all reach ~120 docs/s once batches are
        # length-sorted; GPUs need far larger calls to stay busy.
        self.batch_tokens = batch_tokens or (4096 if self.device == "cpu" else 65536)
        self._dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.model.to(self._dtype).eval()
        tokenizer = _tokenizer(self.model, model)
        self._backend = _untruncated(tokenizer.backend_tokenizer)
        self._specials = _special_count(self._backend)
        self._pad_id = int(tokenizer.pad_token_id or 0)
        self._pad_left = tokenizer.padding_side == "left"
        self._type_ids = "token_type_ids" in tokenizer.model_input_names
        self._lowercase = bool(getattr(self.model[0], "do_lower_case", False))
        limit = _max_tokens(self.model, tokenizer, max_tokens, self._specials)
        self.info = _info(self.model, model, limit, normalize=normalize, prompt=prompt, precision=precision)

    @classmethod
    def from_config(cls, config: Config) -> SentenceTransformerEmbedder:
        return cls(
            config.model,
            normalize=config.normalize,
            prompt=config.prompt,
            max_tokens=config.max_tokens,
            device=config.device,
            precision=config.precision,
            batch_tokens=config.batch_tokens,
            threads=config.threads,
        )

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """Tokenize prompt+text once: count the full length, keep what fits `max_tokens` with specials."""
        prepared = [self.prompt + text for text in texts]
        if self._lowercase:
            prepared = [text.lower() for text in prepared]
        encodings = self._backend.encode_batch(prepared, add_special_tokens=False)
        return [self._finish(encoding) for encoding in encodings]

    def _finish(self, encoding: Encoding) -> Tokens:
        original = len(encoding.ids) + self._specials
        encoding.truncate(self.info.max_tokens - self._specials)
        final = self._backend.post_process(encoding, None, True)
        return Tokens(count=len(final.ids), original_count=original, data=final.ids)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        """Pad the batch's ids to its longest item and run the model once; no second tokenization."""
        import torch

        if not items:
            return np.zeros((0, self.info.dim), dtype=np.float32)
        with torch.inference_mode():
            output = self.model(self._features(items))["sentence_embedding"].float()
            if self.normalize:
                output = torch.nn.functional.normalize(output, p=2, dim=1)
            return np.ascontiguousarray(output.cpu().numpy(), dtype=np.float32)

    def _features(self, items: Sequence[Tokens]) -> dict[str, Any]:
        import torch

        width = max(len(item.data) for item in items)
        ids = np.full((len(items), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            span = slice(width - len(item.data), width) if self._pad_left else slice(0, len(item.data))
            ids[row, span] = item.data
            mask[row, span] = 1
        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if self._type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return {name: tensor.to(self.device) for name, tensor in features.items()}


def _import_torch() -> Any:
    try:
        import sentence_transformers  # noqa: F401
        import torch
    except ImportError:
        raise MissingDependency("sentence-transformers", extra="sentence-transformers") from None
    return torch


def _resolve_device(torch: Any, device: Device, precision: Precision) -> str:
    has_cuda = bool(torch.cuda.is_available())
    if device == "cuda" and not has_cuda:
        raise ConfigError("device 'cuda' requested but CUDA is not available", hint="use 'auto' or 'cpu'")
    resolved = "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"
    if resolved == "cpu" and precision == "fp16":
        raise ConfigError("precision 'fp16' is not offered on CPU", hint="use 'fp32' or 'bf16' on CPU")
    return resolved


def _load(model: str, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # our own progress goes to stderr; theirs would interleave
    with _loading_errors(model):
        return SentenceTransformer(model, device=device, local_files_only=_offline() or Path(model).exists())


@contextmanager
def _loading_errors(model: str) -> Iterator[None]:
    """huggingface_hub, transformers and safetensors raise OSError/ValueError/RuntimeError: make them ours."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        where = "not found locally" if not Path(model).exists() else "could not be loaded"
        raise ConfigError(
            f"model {model!r} {where}: {type(exc).__name__}",
            hint="pass a local model directory or pre-download it into the Hugging Face cache",
        ) from exc


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


def _untruncated(backend: Tokenizer) -> Tokenizer:
    """A copy of the backend without the truncation/padding a tokenizer.json may carry."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _special_count(backend: Tokenizer) -> int:
    processor = backend.post_processor
    return 0 if processor is None else int(processor.num_special_tokens_to_add(False))


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


def _info(model: SentenceTransformer, name: str, limit: int, **choices: Any) -> EmbedderInfo:
    dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = dimension()
    if not isinstance(dim, int):
        raise ConfigError(
            f"model {name!r} does not report its embedding dimension", hint="use a text encoder"
        )
    options = {
        "weights": weights_digest(_model_dir(name)),
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


def _model_dir(name: str) -> Path:
    if Path(name).is_dir():
        return Path(name)
    from huggingface_hub import snapshot_download

    with _loading_errors(name):
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
