"""The `sentence-transformers` embedder: a model on CPU or CUDA, fed the token ids `ColumnTokenizer` made, and
on CUDA the next batch's copy to the device started while the current one runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field

from reindex.columns import TokenColumns, ragged
from reindex.offers import EmbedderOffer, Entry, local_entries
from reindex.ports import EmbedderInfo, EmbedderTraits, Section, Tokens, Vectors
from reindex_adapters.hub import special_count
from reindex_adapters.sentence_transformers.model import (
    Device,
    Precision,
    _info,
    _max_tokens,
    _tokenizer,
    identity_key,
    import_torch,
    load,
    resolve_device,
    truncation,
)
from reindex_adapters.sentence_transformers.tokenizer import ColumnTokenizer

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU or CUDA, fed with token ids the core has already batched."""

    offer: ClassVar[EmbedderOffer] = EmbedderOffer(
        local_entries(
            "sentence-transformers",
            "or vllm on GPUs",
            Entry(
                "precision", "fp32", "bf16 / fp16 change the vectors, and so the fingerprint", is_example=True
            ),
        )
    )  # what `reindex init` writes for it

    # what a loaded one holds (declared: `reindex.identities.Unloaded` loads on the first use of these)
    info: EmbedderInfo
    traits: EmbedderTraits
    device: str
    model: SentenceTransformer
    normalize: bool
    prompt: str
    tokenizer: ColumnTokenizer
    truncate_dim: int | None
    _dtype: Any
    _pad_id: int
    _pad_left: bool
    _type_ids: bool

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        MODEL_PATHS: ClassVar[tuple[str, ...]] = ("model",)  # a folder beside the config, or a hub id
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
        # keep the first n dimensions of each vector, then normalize (a Matryoshka-trained model's smaller
        # sizes: nomic-embed-text-v1.5, mxbai-embed-large-v1); None: the model's full dimension
        truncate_dim: int | None = Field(default=None, gt=0)

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
        truncate_dim: int | None = None,
    ) -> None:
        torch = import_torch()
        if threads:
            torch.set_num_threads(threads)
        self.device = resolve_device(torch, device, precision)
        self.model = load(model, self.device)
        self.normalize, self.prompt = normalize, prompt
        # Measured on 2 CPU cores: 512-4096 tokens per call all reach ~120 docs/s once batches are
        # length-sorted; GPUs need far larger calls to stay busy.
        budget = batch_tokens or (4096 if self.device == "cpu" else 65536)
        self._dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.model.to(self._dtype).eval()
        tokenizer = _tokenizer(self.model, model)
        backend = tokenizer.backend_tokenizer
        self._pad_id = int(tokenizer.pad_token_id or 0)
        self._pad_left = tokenizer.padding_side == "left"
        self._type_ids = "token_type_ids" in tokenizer.model_input_names
        lowercase = bool(getattr(self.model[0], "do_lower_case", False))
        limit = _max_tokens(self.model, tokenizer, max_tokens, special_count(backend))
        self.tokenizer = ColumnTokenizer(
            backend, limit, prompt=prompt, lowercase=lowercase, threads=tokenizer_threads
        )
        self.truncate_dim = truncation(self.model, model, truncate_dim)
        # the `processes` engine loads it once per device in a model process the workers feed with tokens
        self.traits = EmbedderTraits(
            device=self.device, devices=_devices(torch, self.device), batch_tokens=budget
        )
        self.info = _info(
            self.model,
            model,
            limit,
            normalize=normalize,
            prompt=prompt,
            precision=precision,
            **({"truncate_dim": truncate_dim} if truncate_dim else {}),
        )

    @classmethod
    def identity_key(cls, config: Config) -> str | None:
        """The config less what leaves the vectors as they are, and the model's files (`ports.KnowsIdentity`)."""
        unchanged = {"device", "batch_tokens", "threads", "tokenizer_threads"}
        return identity_key(config.model, config.model_dump(exclude=unchanged))

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
            truncate_dim=config.truncate_dim,
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
            output = self.model(features)["sentence_embedding"][:, : self.truncate_dim].float()
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
            output = self.model(self._features(ids, mask))["sentence_embedding"][:, : self.truncate_dim]
            output = output.float()
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


def _devices(torch: Any, device: str) -> int:
    """Model processes the `processes` engine starts: one per visible GPU for device "cuda" (or "auto" on a
    GPU machine), one for a named device ("cuda:1") or the CPU."""
    return max(1, int(torch.cuda.device_count())) if device == "cuda" else 1
