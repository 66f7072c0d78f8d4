"""PacedEmbedder, the `paced` kind: a stand-in for a GPU on a machine without one.

It computes the hash embedder's vectors, then holds each batch until `tokens / rate` seconds have passed
since the call began, sleeping (so the GIL is released, as a GPU kernel releases it), and it runs one batch
at a time: under the `processes` engine it lives in the model process the workers feed, so the fraction of
the run's wall time it spends busy is the fraction a GPU of that speed would. `scripts/bench` sets `rate`
to a fraction of what the pipeline reaches without it.
"""

from __future__ import annotations

import threading
import time
from typing import Literal

from pydantic import ConfigDict, Field

from reindex.columns import TokenColumns
from reindex.ports import EmbedderTraits, Section, Vectors
from reindex_adapters.testing.memory.hash_embedder import HashEmbedder, _words


class WordTokenizer:
    """The hash embedder's whitespace words as a tokenizer that travels to other processes (it pickles)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, texts: list[str]) -> TokenColumns:
        return _words(texts, self.limit)


class PacedEmbedder(HashEmbedder):
    """A model on an emulated accelerator: it computes `rate` tokens a second, one batch at a time, in a model
    process of its own under the `processes` engine (its device is no GPU: Ray is asked for none)."""

    class Config(Section):
        model_config = ConfigDict(extra="forbid", frozen=True)
        kind: Literal["paced"]
        dim: int = 32
        max_tokens: int = 512
        seed: str = ""
        rate: float = Field(gt=0)  # tokens per second the "device" computes
        batch_tokens: int = Field(default=16384, gt=0)  # tokens per call, as a GPU's batches

    def __init__(
        self, dim: int = 32, max_tokens: int = 512, seed: str = "", *, rate: float, batch_tokens: int = 16384
    ) -> None:
        super().__init__(dim, max_tokens, seed)
        self.rate = rate
        self.traits = EmbedderTraits(device="emulated", devices=1, batch_tokens=batch_tokens)
        self._device = threading.Lock()  # one batch at a time

    @classmethod
    def from_config(cls, config: Config) -> PacedEmbedder:  # type: ignore[override]
        return cls(
            config.dim, config.max_tokens, config.seed, rate=config.rate, batch_tokens=config.batch_tokens
        )

    @property
    def column_tokenizer(self) -> WordTokenizer:  # type: ignore[override]
        return WordTokenizer(self.info.max_tokens)

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        with self._device:
            started = time.monotonic()
            vectors = super().embed_columns(tokens)
            rest = float(tokens.counts.sum()) / self.rate - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)
            return vectors
