"""Counting and cutting texts in mistral-embed's own tokenizer.

mistral-embed uses Mistral's v1 tokenizer (the mistral-common README: "v1: open-mistral-7b, open-mixtral-8x7b,
mistral-embed"), a SentencePiece model that the `mistral-common` package ships (`MistralTokenizer.v1()`), so
counts are exact and offline. The API truncates nothing: an input over the limit is refused. The limit is
counted with the BOS token, as Hugging Face's copy of the tokenizer counts: a text of 8,190 such tokens was
embedded and one of 8,192 refused (github.com/langchain-ai/langchain/issues/20523, measured against the real
API), so MAX_TOKENS is 8,190. Cut at 8,000 cl100k_base tokens, English prose is about 9,300 of these (1.16 on
this project's README), which is why counting in cl100k_base lost long documents.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from reindex.errors import MissingDependency
from reindex.ports import TokenCounts, Tokens

MAX_TOKENS = 8190  # BOS included; 8,192 was refused (the issue above)
COUNTS = TokenCounts(True, "mistral-embed's own tokenizer (mistral-common v1, BOS included)")


@functools.cache
def _tokenizer() -> Any:
    try:
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    except ImportError as exc:
        raise MissingDependency("mistral-common", extra="mistral") from exc
    return MistralTokenizer.v1().instruct_tokenizer.tokenizer


def count(text: str) -> int:
    """A whole text's tokens, BOS included: what the API checks against MAX_TOKENS."""
    return len(_tokenizer().encode(text, bos=True, eos=False))


def tokenize(texts: Sequence[str], max_tokens: int) -> list[Tokens]:
    """Exact counts; `data` is the text sent, cut at a token boundary when longer than `max_tokens`."""
    tokenizer = _tokenizer()
    out = []
    for text in texts:
        ids = tokenizer.encode(text, bos=True, eos=False)
        if len(ids) <= max_tokens:
            out.append(Tokens(len(ids), len(ids), text))
            continue
        cut, count = _cut(tokenizer, ids, max_tokens)
        out.append(Tokens(count, len(ids), cut))
    return out


def _cut(tokenizer: Any, ids: list[int], limit: int) -> tuple[str, int]:
    """The longest prefix of the text whose own encoding fits `limit` (decoding and encoding again can
    merge differently at the cut, so the count is taken from the text that is sent)."""
    end = limit
    while end > 1:
        text = tokenizer.decode(ids[1:end])  # ids[0] is BOS
        count = len(tokenizer.encode(text, bos=True, eos=False))
        if count <= limit:
            return text, count
        end -= max(1, count - limit)
    return "", 1
