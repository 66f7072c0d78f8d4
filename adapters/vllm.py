"""vLLM embedder on CUDA: the core's token ids go straight to vLLM's scheduler (continuous batching).

The vLLM API has moved between releases, so the engine arguments are chosen by feature checks
(signatures and config fields), never by version strings.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import ConfigDict, Field

from reindex.errors import BackendError, ConfigError, MissingDependency
from reindex.fingerprint import fingerprint
from reindex.offers import EmbedderOffer, local_entries
from reindex.ports import EmbedderInfo, EmbedderTraits, Section, Tokens, Vectors
from reindex_adapters.hub import model_dir, special_count, untruncated, weights_digest

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Pooling = Literal["mean", "cls", "last"]
Step = Literal["load", "start", "embed"]
APPLIED_MODULES = {"Transformer", "Pooling", "Normalize"}  # vLLM runs these; any other module changes vectors
ST_POOLING = {"mean": "mean", "mean_tokens": "mean", "cls": "cls", "cls_token": "cls", "lasttoken": "last"}
NORMALIZE_FIELDS = ("normalize", "use_activation")  # the switch's name moved between releases
POOLING_FIELDS = ("pooling_type", "seq_pooling_type")


@dataclass(frozen=True, eq=False)
class VllmSpec:
    """What the model directory and the options resolve to, before any engine starts."""

    path: Path
    dtype: str
    pooling: str
    normalize: bool
    max_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    tokenizer: PromptTokenizer
    info: EmbedderInfo


class VllmEmbedder:
    """A pooling model served by vLLM's offline engine, fed with ids tokenized once by the core."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        local_entries("vllm", "continuous batching on GPUs")
    )  # what `reindex init` writes for it

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        MODEL_PATHS: ClassVar[tuple[str, ...]] = ("model",)  # a folder beside the config, or a hub id
        kind: Literal["vllm"]
        model: str  # a local model directory (or a name already in the Hugging Face cache)
        dtype: Dtype = "auto"
        max_model_len: int | None = Field(default=None, gt=0)
        gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
        tensor_parallel_size: int = Field(default=1, ge=1)
        normalize: bool = True
        prompt: str = ""
        max_tokens: int | None = Field(default=None, gt=0)
        pooling: Pooling | None = None  # default: the model's sentence-transformers Pooling config

    def __init__(self, llm: Any, spec: VllmSpec) -> None:
        self._llm, self.spec, self.info = llm, spec, spec.info
        # continuous batching wants large calls; [run] batch_tokens overrides. Its engine tokenizes and owns
        # the GPU itself: no model process of ours to feed (device None)
        self.traits = EmbedderTraits(batch_tokens=65536)
        self._call, self._call_options = embed_call(llm, pooling_params_class())

    @classmethod
    def from_config(cls, config: Config) -> VllmEmbedder:
        vllm = _import_vllm()
        _require_cuda()
        spec = resolve_model(config)
        arguments = engine_arguments(engine_fields(vllm), pooler_config_class(), spec)
        with _translated("start"):
            llm = vllm.LLM(**arguments)
        return cls(llm, spec)

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        return self.spec.tokenizer.tokenize(texts)

    def embed(self, items: Sequence[Tokens]) -> Vectors:
        """Hand vLLM the whole batch as token ids; its scheduler batches them, no second tokenization."""
        if not items:
            return np.zeros((0, self.info.dim), dtype=np.float32)
        prompts = [{"prompt_token_ids": list(item.data)} for item in items]  # == vllm.inputs.TokensPrompt
        with _translated("embed"):
            outputs = self._call(prompts, **self._call_options)
        vectors = np.vstack([_as_array(output) for output in outputs]).astype(np.float32)
        if vectors.shape != (len(items), self.info.dim):
            raise BackendError(
                f"vLLM returned vectors of shape {vectors.shape}, expected {len(items)}x{self.info.dim}"
            )
        return np.ascontiguousarray(_normalized(vectors) if self.spec.normalize else vectors)


class PromptTokenizer:
    """prompt + text, tokenized once with the model's fast tokenizer; truncation keeps the special tokens."""

    def __init__(self, backend: Tokenizer, *, prompt: str, lowercase: bool, max_tokens: int) -> None:
        self._backend = untruncated(backend)
        self.specials = special_count(self._backend)
        self.prompt, self.lowercase, self.max_tokens = prompt, lowercase, max_tokens

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        prepared = [self.prompt + text for text in texts]
        if self.lowercase:
            prepared = [text.lower() for text in prepared]
        encodings = self._backend.encode_batch(prepared, add_special_tokens=False)
        return [self._finish(encoding) for encoding in encodings]

    def _finish(self, encoding: Encoding) -> Tokens:
        original = len(encoding.ids) + self.specials
        encoding.truncate(self.max_tokens - self.specials)
        final = self._backend.post_process(encoding, None, True)
        return Tokens(count=len(final.ids), original_count=original, data=final.ids)


# the model directory -------------------------------------------------------------------------------------


def resolve_model(config: VllmEmbedder.Config) -> VllmSpec:
    """Read the model directory and fix every option that changes vectors; starts no engine, needs no GPU."""
    with _translated("load"):
        path = model_dir(config.model)
        files = _ModelFiles.read(path)
        tokenizer = _fast_tokenizer(path, config.model)
    pooling = config.pooling or files.pooling(config.model)
    files.check_applicable(config.model, prompt=config.prompt)
    limit = files.max_tokens(config.max_tokens, special_count(tokenizer.backend_tokenizer))
    dtype = resolve_dtype(config.dtype, files.config)
    options = {
        "weights": weights_digest(path),
        "dtype": dtype,
        "pooling": pooling,
        "normalize": config.normalize,
        "prompt": config.prompt,
        "max_tokens": limit,
    }
    identity = Path(config.model).name if Path(config.model).exists() else config.model
    dim = files.dim(config.model)
    info = EmbedderInfo(
        "vllm", config.model, dim, limit, fingerprint("vllm", identity, dim, options), options
    )
    return VllmSpec(
        path=path,
        dtype=dtype,
        pooling=pooling,
        normalize=config.normalize,
        max_tokens=limit,
        max_model_len=_max_model_len(config.max_model_len, limit),
        gpu_memory_utilization=config.gpu_memory_utilization,
        tensor_parallel_size=config.tensor_parallel_size,
        tokenizer=PromptTokenizer(
            tokenizer.backend_tokenizer, prompt=config.prompt, lowercase=files.lowercase, max_tokens=limit
        ),
        info=info,
    )


def resolve_dtype(requested: Dtype, model_config: Mapping[str, Any]) -> str:
    """vLLM's rule for "auto", made explicit: bf16 checkpoints run in bf16, fp32 and fp16 ones in fp16."""
    if requested != "auto":
        return requested
    stored = str(model_config.get("torch_dtype") or model_config.get("dtype") or "float32")
    return "bfloat16" if stored == "bfloat16" else "float16"


@dataclass(frozen=True)
class _ModelFiles:
    """The JSON files of a (sentence-transformers) model directory that decide its vectors."""

    config: dict[str, Any]
    modules: list[dict[str, Any]]
    sentence_config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    pooling_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> _ModelFiles:
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{path} has no config.json", hint="point model at a Hugging Face model directory"
            )
        modules: list[dict[str, Any]] = _json(path / "modules.json", [])
        pooling_dirs = [m.get("path", "") for m in modules if _module_name(m) == "Pooling"]
        return cls(
            config=_json(path / "config.json", {}),
            modules=modules,
            sentence_config=_json(path / "sentence_bert_config.json", {}),
            tokenizer_config=_json(path / "tokenizer_config.json", {}),
            pooling_config=_json(path / pooling_dirs[0] / "config.json", {}) if pooling_dirs else {},
        )

    @property
    def lowercase(self) -> bool:
        return bool(self.sentence_config.get("do_lower_case", False))

    def pooling(self, name: str) -> str:
        """The sentence-transformers pooling ("mean", "cls", "last"): vLLM's own default may differ."""
        mode = self.pooling_config.get("pooling_mode")
        modes = [mode] if isinstance(mode, str) else _flag_modes(self.pooling_config)
        if not modes:
            raise ConfigError(
                f"model {name!r} has no sentence-transformers Pooling config", hint='set pooling = "mean"'
            )
        if len(modes) != 1 or modes[0] not in ST_POOLING:
            raise ConfigError(
                f"model {name!r} pools with {'+'.join(modes)}, which vLLM does not offer",
                hint='use kind = "sentence-transformers" for this model',
            )
        return ST_POOLING[modes[0]]

    def check_applicable(self, name: str, *, prompt: str) -> None:
        """Refuse models whose sentence-transformers modules vLLM would silently skip."""
        extra = sorted({_module_name(m) for m in self.modules} - APPLIED_MODULES)
        if extra:
            raise ConfigError(
                f"model {name!r} has sentence-transformers modules vLLM does not apply: {', '.join(extra)}",
                hint='use kind = "sentence-transformers" for this model',
            )
        if prompt and self.pooling_config.get("include_prompt") is False:
            raise ConfigError(
                f"model {name!r} pools without its prompt tokens, which vLLM cannot do",
                hint='use kind = "sentence-transformers" for prompted embeddings of this model',
            )

    def dim(self, name: str) -> int:
        for key in ("embedding_dimension", "word_embedding_dimension"):
            if isinstance(self.pooling_config.get(key), int):
                return int(self.pooling_config[key])
        hidden = self.config.get("hidden_size")
        if not isinstance(hidden, int):
            raise ConfigError(f"model {name!r} does not state its hidden size", hint="use a text encoder")
        return hidden

    def max_tokens(self, requested: int | None, specials: int) -> int:
        """The same limit the sentence-transformers embedder applies: requested, else max_seq_length."""
        sequence = self.sentence_config.get("max_seq_length")
        ceilings = [
            self.config.get("max_position_embeddings"),
            self.tokenizer_config.get("model_max_length"),
            sequence,
        ]
        ceiling = min((v for v in ceilings if isinstance(v, int) and 0 < v < 1_000_000), default=None)
        if ceiling is None:
            raise ConfigError("the model states no maximum input length", hint="set max_tokens")
        limit = requested or (sequence if isinstance(sequence, int) else ceiling)
        if limit > ceiling or limit <= specials:
            raise ConfigError(
                f"max_tokens {limit} is outside what the model accepts ({specials + 1}..{ceiling})",
                hint=f"set max_tokens to at most {ceiling}",
            )
        return limit


def _json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def _module_name(module: Mapping[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _flag_modes(pooling_config: Mapping[str, Any]) -> list[str]:
    prefix = "pooling_mode_"
    return [
        key.removeprefix(prefix)
        for key, on in pooling_config.items()
        if key.startswith(prefix) and on is True
    ]


def _fast_tokenizer(path: Path, name: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MissingDependency("transformers", extra="vllm") from None
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"model {name!r} has no fast (tokenizers) text tokenizer",
            hint="use a model that ships tokenizer.json",
        )
    return tokenizer


def _max_model_len(requested: int | None, max_tokens: int) -> int:
    if requested is not None and requested < max_tokens:
        raise ConfigError(
            f"max_model_len {requested} is below max_tokens {max_tokens}",
            hint=f"raise max_model_len to at least {max_tokens} or lower max_tokens",
        )
    return requested or max_tokens  # no longer inputs ever reach the engine: keep its KV budget small


# the engine ----------------------------------------------------------------------------------------------


def engine_fields(vllm: Any) -> set[str]:
    """Every keyword the installed `vllm.LLM` accepts: its own parameters and EngineArgs' fields."""
    names = set(_parameters(vllm.LLM.__init__))
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return names
    return names | set(_parameters(EngineArgs))


def engine_arguments(fields: set[str], pooler_class: type | None, spec: VllmSpec) -> dict[str, Any]:
    """`vllm.LLM` keywords for an embedding engine on the installed release (runner= vs task=)."""
    arguments: dict[str, Any] = {
        "model": str(spec.path),
        "tokenizer": str(spec.path),
        "dtype": spec.dtype,
        "max_model_len": spec.max_model_len,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "tensor_parallel_size": spec.tensor_parallel_size,
    }
    if "runner" in fields:
        arguments["runner"] = "pooling"
        if "convert" in fields:
            arguments["convert"] = "embed"
    elif "task" in fields:
        arguments["task"] = "embed"
    else:
        raise ConfigError("this vLLM release offers no embedding runner", hint="pip install 'vllm>=0.7'")
    return arguments | _pooler_argument(fields, pooler_class, spec)


def _pooler_argument(fields: set[str], pooler_class: type | None, spec: VllmSpec) -> dict[str, Any]:
    keyword = next((name for name in ("pooler_config", "override_pooler_config") if name in fields), None)
    if keyword is None:
        raise ConfigError(
            "this vLLM release cannot set the pooling explicitly", hint="pip install 'vllm>=0.7'"
        )
    accepted = set(_parameters(pooler_class)) if pooler_class is not None else set(POOLING_FIELDS[:1])
    pooling = next((name for name in POOLING_FIELDS if name in accepted), None)
    if pooling is None:
        raise ConfigError(
            "this vLLM release's PoolerConfig has no pooling type", hint="pin a vLLM release >= 0.7"
        )
    values: dict[str, Any] = {pooling: spec.pooling.upper()}
    raw = _raw_switch(accepted)  # raw vectors from vLLM: normalized here, in fp32, whatever the release
    if not raw and not spec.normalize:
        raise ConfigError("this vLLM release cannot return unnormalized vectors", hint="set normalize = true")
    values |= raw
    return {keyword: pooler_class(**values) if pooler_class is not None else values}


def _raw_switch(accepted: set[str]) -> dict[str, bool]:
    """One switch that turns vLLM's normalization off: setting two aliases of it may be refused."""
    name = next((name for name in NORMALIZE_FIELDS if name in accepted), None)
    return {} if name is None else {name: False}


def embed_call(llm: Any, pooling_params: type | None) -> tuple[Callable[..., Any], dict[str, Any]]:
    """`llm.embed` (or `llm.encode` on old releases) and the keywords it accepts here."""
    call = getattr(llm, "embed", None) or llm.encode
    accepted = set(_parameters(call))
    options: dict[str, Any] = {"use_tqdm": False} if "use_tqdm" in accepted else {}
    raw = _raw_switch(set(_parameters(pooling_params)))
    if pooling_params is not None and raw and "pooling_params" in accepted:
        options["pooling_params"] = pooling_params(**raw)
    return call, options


def pooler_config_class() -> type | None:
    for module in ("vllm.config", "vllm.config.pooler"):
        found = getattr(_optional_module(module), "PoolerConfig", None)
        if isinstance(found, type):
            return found
    return None


def pooling_params_class() -> type | None:
    found = getattr(_optional_module("vllm"), "PoolingParams", None)
    return found if isinstance(found, type) else None


def _optional_module(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _parameters(target: Any) -> list[str]:
    """Keyword names of a callable, dataclass or msgspec struct (vLLM uses all three)."""
    if target is None:
        return []
    if dataclasses.is_dataclass(target):
        return [f.name for f in dataclasses.fields(target)]
    struct_fields = getattr(target, "__struct_fields__", None)
    if struct_fields is not None:
        return list(struct_fields)
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []


def _as_array(output: Any) -> Any:
    result = output.outputs
    value = getattr(result, "embedding", None)
    if value is None:
        value = getattr(result, "data", None)
    if value is None:
        raise BackendError(f"vLLM returned {type(result).__name__} without an embedding")
    if hasattr(value, "detach"):  # a torch tensor (PoolingOutput.data)
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32).reshape(1, -1)


def _normalized(vectors: Vectors) -> Vectors:
    """Unit length in fp32; a zero vector stays zero, so validation dead-letters it."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    result: Vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return result


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise MissingDependency("vllm", extra="vllm") from None
    return vllm


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "the vllm embedder needs a CUDA GPU and none is available here",
            hint='use kind = "sentence-transformers" (device = "cpu") on this machine',
        )


@contextmanager
def _translated(step: Step) -> Iterator[None]:
    """Model files and vLLM raise OSError/ValueError/RuntimeError (and torch OOM): make them ours, once."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _our_error(step, exc) from exc


def _our_error(step: Step, exc: BaseException) -> Exception:
    what = f"{type(exc).__name__}: {exc}"
    if step == "load":
        return ConfigError(f"model files could not be read: {what}", hint="pass a local model directory")
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without importing torch
        hint = "lower gpu_memory_utilization or max_model_len, or use a smaller [run] batch_tokens"
        error = ConfigError if step == "start" else BackendError
        return error(f"vLLM ran out of GPU memory: {what}", hint=hint)
    if step == "start":
        return ConfigError(
            f"vLLM could not start the model: {what}",
            hint="check the model directory, the GPU and the vLLM release (BERT-style encoders need vllm>=0.7)",
        )
    return BackendError(f"vLLM failed while embedding: {what}")
