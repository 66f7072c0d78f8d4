"""Local embedder on sentence-transformers: tokenize once with the model's fast tokenizer, embed the ids.

`ColumnTokenizer` is the columnar hot path (also used by the hash embedder's `tokenizer` option): one
`encode_batch` per chunk on a thread pool (the Rust code releases the GIL), ids flattened in C, truncation
and the post-processor's special tokens applied to the flat array by numpy.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from reindex.columns import TokenColumns, ragged
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
PROBES = ("hello world", "", "a", "Ünïcödé 漢字 🙂 text", "North and south, east and west: " * 9)
MIN_CHUNK = 256  # texts per encode_batch call on the pool; smaller chunks are not worth a hand-off
FALSE_WORDS = {"", "0", "off", "false", "f", "no", "n"}


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
        tokenizer_threads: int | None = Field(default=None, gt=0)  # None: every core (see ColumnTokenizer)

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
        tokenizer_threads: int | None = None,
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
        backend = tokenizer.backend_tokenizer
        self._pad_id = int(tokenizer.pad_token_id or 0)
        self._pad_left = tokenizer.padding_side == "left"
        self._type_ids = "token_type_ids" in tokenizer.model_input_names
        lowercase = bool(getattr(self.model[0], "do_lower_case", False))
        limit = _max_tokens(self.model, tokenizer, max_tokens, _special_count(backend))
        self.tokenizer = ColumnTokenizer(
            backend, limit, prompt=prompt, lowercase=lowercase, threads=tokenizer_threads
        )
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
            tokenizer_threads=config.tokenizer_threads,
        )

    @property
    def column_tokenizer(self) -> ColumnTokenizer:
        """`tokenize_columns` without the model: it pickles (the ray engine's read tasks tokenize with it)."""
        return self.tokenizer

    def tokenize_columns(self, texts: list[str]) -> TokenColumns:
        """Tokenize prompt+text once: count the full length, keep what fits `max_tokens` with specials."""
        return self.tokenizer(texts)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return list(self.tokenizer(list(texts)))

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        """Pad the batch's ids to its longest row (numpy) and run the model once; no second tokenization."""
        if not len(tokens):
            return np.zeros((0, self.info.dim), dtype=np.float32)
        if tokens.ids is None:  # columns of per-text Tokens: their data are the ids
            tokens = TokenColumns(tokens.counts, tokens.original, *ragged(tokens.items or []))
        ids, mask = tokens.padded(self._pad_id, left=self._pad_left)
        return self._run(ids, mask)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        return self.embed_columns(TokenColumns.from_tokens(items))

    def prepare_columns(self, tokens: TokenColumns) -> dict[str, Any]:
        """Pad, pin and start the copy to the device (the pipeline calls this for the next batch while
        the current one runs)."""
        if tokens.ids is None:
            tokens = TokenColumns(tokens.counts, tokens.original, *ragged(tokens.items or []))
        return self._features(*tokens.padded(self._pad_id, left=self._pad_left))

    def embed_prepared(self, features: dict[str, Any]) -> Vectors | _Pending:
        """Launch the model on prepared features. On CUDA, return at once: the vectors come back through
        pinned memory, and `result()` waits for them, so the next batch is queued before this one ends."""
        import torch

        with torch.inference_mode():
            output = self.model(features)["sentence_embedding"].float()
            if self.normalize:
                output = torch.nn.functional.normalize(output, p=2, dim=1)
            if self.device == "cpu":
                return np.ascontiguousarray(output.numpy(), dtype=np.float32)
            host = torch.empty(output.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(output, non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
            return _Pending(host, done)

    def _run(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> Vectors:
        import torch

        with torch.inference_mode():
            output = self.model(self._features(ids, mask))["sentence_embedding"].float()
            if self.normalize:
                output = torch.nn.functional.normalize(output, p=2, dim=1)
            return np.ascontiguousarray(output.cpu().numpy(), dtype=np.float32)

    def _features(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> dict[str, Any]:
        import torch

        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if self.device != "cpu":  # page-locked host copies let the transfer run beside the model
            features = {k: v.pin_memory().to(self.device, non_blocking=True) for k, v in features.items()}
        if self._type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return features


class _Pending:
    """Vectors on their way back from the device: `result()` waits for the copy, then reads them."""

    def __init__(self, host: Any, done: Any) -> None:
        self._host, self._done = host, done

    def result(self) -> Vectors:
        self._done.synchronize()
        return np.ascontiguousarray(self._host.numpy(), dtype=np.float32)


class ColumnTokenizer:
    """A `tokenizers.Tokenizer` that answers `TokenColumns`: O(1) Python calls per chunk of texts.

    The texts are split into chunks encoded on a per-process thread pool of `threads` (default: every
    core this process may use); `encode_batch` releases the GIL, so this is parallel even with
    TOKENIZERS_PARALLELISM=false, and fork-safe because no Rust thread pool is started. A user who sets
    TOKENIZERS_PARALLELISM to a true value gets the library's own pool instead (one call per batch).
    The post-processor's special tokens are found once, by post-processing probes; a post-processor
    that is not "prefix + ids + suffix" is applied per encoding (slower, same ids).
    """

    def __init__(
        self,
        backend: Tokenizer,
        max_tokens: int,
        *,
        prompt: str = "",
        lowercase: bool = False,
        threads: int | None = None,
    ) -> None:
        self.backend = _untruncated(backend)
        self.specials = _special_count(self.backend)
        if max_tokens <= self.specials:
            raise ConfigError(f"max_tokens {max_tokens} leaves no room beside {self.specials} special tokens")
        self.max_tokens, self.prompt, self.lowercase = max_tokens, prompt, lowercase
        self.threads = threads or _default_threads()
        self._encode = _batch_encoder(self.backend)
        self._frame = _template(self.backend, self.specials)
        self.digest: str | None = None  # the tokenizer file's sha256 when read from one

    @classmethod
    def from_file(cls, path: str, max_tokens: int, *, threads: int | None = None) -> ColumnTokenizer:
        """A tokenizer.json, or a model folder holding one; `digest` is the file's sha256."""
        from tokenizers import Tokenizer

        file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
        try:
            data = file.read_bytes()
            backend = Tokenizer.from_str(data.decode())
        except Exception as exc:  # tokenizers raises a bare Exception for a broken file
            raise ConfigError(
                f"tokenizer {path!r} could not be loaded", hint="pass a tokenizer.json"
            ) from exc
        tokenizer = cls(backend, max_tokens, threads=threads)
        tokenizer.digest = hashlib.sha256(data).hexdigest()
        return tokenizer

    def __call__(self, texts: list[str]) -> TokenColumns:
        if self.prompt:
            texts = list(map(self.prompt.__add__, texts))
        if self.lowercase:
            texts = list(map(str.lower, texts))
        size = max(MIN_CHUNK, -(-len(texts) // (self.threads * 4)))
        if self.threads == 1 or len(texts) <= size:
            return self._chunk(texts)
        chunks = [texts[start : start + size] for start in range(0, len(texts), size)]
        return TokenColumns.concat(list(_pool(self.threads).map(self._chunk, chunks)))

    def _chunk(self, texts: list[str]) -> TokenColumns:
        encodings = self._encode(texts, add_special_tokens=False)
        if self._frame is None:
            return self._post_processed(encodings)
        ids = list(map(attrgetter("ids"), encodings))
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        return framed(flat, lengths, self.max_tokens - self.specials, *self._frame)

    def _post_processed(self, encodings: list[Encoding]) -> TokenColumns:
        """The tokenizer's own post-processor per encoding (a template numpy cannot reproduce)."""
        original = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings)) + self.specials
        finals = []
        for encoding in encodings:
            encoding.truncate(self.max_tokens - self.specials)
            finals.append(self.backend.post_process(encoding, None, True).ids)
        flat, offsets = ragged(finals)
        return TokenColumns(np.diff(offsets), original, flat, offsets)


def framed(
    flat: NDArray[np.int64],
    lengths: NDArray[np.int64],
    limit: int,
    prefix: Sequence[int],
    suffix: Sequence[int],
) -> TokenColumns:
    """Rows of `flat` (ragged by `lengths`) cut to `limit` ids, each framed by `prefix` and `suffix`."""
    kept = np.minimum(lengths, limit)
    if (kept < lengths).any():
        starts, new = _offsets(lengths)[:-1], _offsets(kept)
        flat = flat[np.repeat(starts - new[:-1], kept) + np.arange(int(new[-1]), dtype=np.int64)]
    counts = kept + len(prefix) + len(suffix)
    offsets = _offsets(counts)
    if not prefix and not suffix:
        return TokenColumns(counts, lengths + 0, flat, offsets)
    head = offsets[:-1, None] + np.arange(len(prefix))
    tail = offsets[1:, None] - len(suffix) + np.arange(len(suffix))
    specials = np.concatenate([head, tail], axis=1).ravel()  # each row's special positions, in order
    ids = np.empty(int(offsets[-1]), dtype=np.int64)
    body = np.ones(len(ids), dtype=np.bool_)
    body[specials] = False
    ids[body] = flat
    ids[specials] = np.tile(np.asarray([*prefix, *suffix], dtype=np.int64), len(counts))
    return TokenColumns(counts, lengths + len(prefix) + len(suffix), ids, offsets)


def _offsets(lengths: NDArray[np.int64]) -> NDArray[np.int64]:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _template(backend: Tokenizer, specials: int) -> tuple[list[int], list[int]] | None:
    """(prefix, suffix) such that post-processing is `prefix + ids + suffix` for every probe, truncated
    or not; None when no split explains them all (then encodings are post-processed one by one)."""
    cases = []
    for text in PROBES:
        encoding = backend.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        cases.append((ids, backend.post_process(encoding, None, True).ids))
        encoding.truncate(max(len(ids) // 2, 1))
        cases.append((ids[: max(len(ids) // 2, 1)], backend.post_process(encoding, None, True).ids))
    ids, full = cases[0]
    for head in range(len(full) - len(ids) + 1):
        prefix, suffix = full[:head], full[head + len(ids) :]
        if len(prefix) + len(suffix) == specials and all(prefix + i + suffix == f for i, f in cases):
            return prefix, suffix
    return None


def _batch_encoder(backend: Tokenizer) -> Any:
    """`encode_batch_fast` (no character offsets) where this tokenizers has it and it gives the same ids."""
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None:
        return backend.encode_batch
    same = [e.ids for e in fast(list(PROBES), add_special_tokens=False)]
    return (
        fast
        if same == [e.ids for e in backend.encode_batch(list(PROBES), add_special_tokens=False)]
        else backend.encode_batch
    )


def _default_threads() -> int:
    """Every core this process may use, unless the user asked for the tokenizers library's own pool."""
    if os.environ.get("TOKENIZERS_PARALLELISM", "false").strip().lower() not in FALSE_WORDS:
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per process and size: a forked child builds its own (the parent's threads are not there)."""
    key = (os.getpid(), threads)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="reindex-tokenize")
        return _POOLS[key]


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
