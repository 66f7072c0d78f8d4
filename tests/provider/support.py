"""What the provider end-to-end tests share: the corpus, the tool's configuration around one `[embedder]`
section, runs carried to the end through resumable stops, and the checks every batch provider must pass
(verified, one job per key, billed once per unique text, the model's vectors stored)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psycopg
import pytest
from psycopg import sql

from reindex_adapters.remote.tokens import cl100k
from reindex_adapters.testing.memory import HashEmbedder
from tests.durability.support import Tool

POISON = "poisoned input"
KeyOf = Callable[[Mapping[str, Any]], object]
Counting = Callable[[str], int]


class Emulator(Protocol):
    def stats(self) -> dict[str, Any]: ...


def corpus(path: Path, n: int = 300, *, poison: bool = False) -> list[str]:
    texts = [f"document {i} about {'alpha beta ' * (i % 9)}topic {i % 41}" for i in range(n)]
    texts += [texts[5]] * 12  # duplicates: billed once
    if poison:
        texts.append(f"this is a {POISON} for the provider")
    with path.open("w") as out:
        for i, text in enumerate(texts):
            out.write(json.dumps({"id": f"d{i:04d}", "text": text}) + "\n")
    return texts


def cl100k_count(text: str) -> int:
    return len(cl100k().encode(text))


def mistral_count(text: str) -> int:
    """mistral-embed's own count (mistral-common's v1 tokenizer, BOS included), read without the adapter."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return len(MistralTokenizer.v1().instruct_tokenizer.tokenizer.encode(text, bos=True, eos=False))


def unique_tokens(texts: list[str], *, skip: str | None = None, count: Counting = cl100k_count) -> int:
    """The unique texts' tokens as an emulator bills them: cl100k_base, unless the provider's own `count`."""
    return sum(count(text) for text in set(texts) if not (skip and skip in text))


def toml_lines(values: Mapping[str, object]) -> str:
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def write_config(
    tmp_path: Path, pg_dsn: str, embedder: Mapping[str, object], run: Mapping[str, object], *, name: str
) -> Tool:
    """`tmp_path/name`: docs.jsonl into pgvector's alias `docs` through `embedder`, the ledger in state.db."""
    config = tmp_path / name
    config.write_text(
        f'[source]\nkind = "jsonl"\npath = "{tmp_path / "docs.jsonl"}"\n\n[embedder]\n{toml_lines(embedder)}\n'
        f'[target]\nkind = "pgvector"\ndsn = "{pg_dsn}"\nalias = "docs"\n\n'
        f'[run]\nstate = "{tmp_path / "state.db"}"\n{toml_lines(run)}'
    )
    return Tool(config, tmp_path / "state.db")


def make_tool(
    tmp_path: Path,
    pg_dsn: str,
    embedder: Mapping[str, object],
    *,
    name: str,
    documents: int = 300,
    shard_size: int = 100,
    poison: bool = False,
    **run: object,
) -> tuple[Tool, list[str]]:
    """The corpus written and the tool configured to poll fast; `run` adds or overrides `[run]` keys."""
    texts = corpus(tmp_path / "docs.jsonl", documents, poison=poison)
    options = {"shard_size": shard_size, "poll_seconds": 0.05, "poll_max_seconds": 0.2, **run}
    return write_config(tmp_path, pg_dsn, embedder, options, name=name), texts


def run_to_end(tool: Tool, env: Mapping[str, str], *flags: str, attempts: int = 6) -> str:
    """Run again after each resumable stop (exit 75) until a run finishes; what that run printed."""
    for _ in range(attempts):
        code, out, err = tool.run("run", *flags, env=dict(env), timeout=240)
        if code == 0:
            return out
        assert code == 75, err
    pytest.fail("the run did not finish")


def kill_at(tool: Tool, env: Mapping[str, str], point: str) -> None:
    """A run SIGKILLed at the second pass of `point` (reindex's REINDEX_CRASH_AT)."""
    code, _, err = tool.run("run", env={**env, "REINDEX_CRASH_AT": f"{point}:2"})
    assert code == -signal.SIGKILL, f"{point}: {err}"


def reindex_key(job: Mapping[str, Any]) -> object:
    return job["metadata"].get("reindex_key")


def one_job_per_key(stats: Mapping[str, Any], key: KeyOf = reindex_key) -> None:
    keys = Counter(key(job) for job in stats["batches"])
    assert keys and max(keys.values()) == 1, f"one job per key: {keys}"


def assert_verified_once_billed(
    tool: Tool,
    emulator: Emulator,
    texts: list[str],
    *,
    skip: str | None = None,
    key: KeyOf = reindex_key,
    count: Counting = cl100k_count,
) -> dict[str, Any]:
    """Verified, one job per key, billed exactly the unique texts' tokens, nothing sent before Retry-After."""
    assert tool.json("verify")["complete"]
    stats = emulator.stats()
    one_job_per_key(stats, key)
    assert (
        stats["billed_tokens"] == stats["billed_tokens_batch"] == unique_tokens(texts, skip=skip, count=count)
    )
    assert stats["early_requests_total"] == 0
    return stats


def stored_vectors(pg_dsn: str, target: str) -> dict[str, np.ndarray]:
    """The target's vectors by their text."""
    with psycopg.connect(pg_dsn) as conn:
        query = sql.SQL("SELECT text, embedding::text FROM {}").format(sql.Identifier(target))
        rows = conn.execute(query).fetchall()
    return {text: np.asarray(json.loads(vector), dtype=np.float32) for text, vector in rows}


def assert_the_models_vectors(
    pg_dsn: str, target: str, texts: list[str], model: HashEmbedder, *, prompt: str = ""
) -> None:
    """The target holds each text once, with `model`'s vector of the text behind the provider's `prompt`."""
    stored = stored_vectors(pg_dsn, target)
    assert set(stored) == set(texts)
    ordered = sorted(stored)
    reference = model.embed(model.tokenize([prompt + text for text in ordered]))
    np.testing.assert_allclose(np.stack([stored[text] for text in ordered]), reference, atol=1e-6)


def assert_the_budget_stops_resumably(
    tool: Tool, emulator: Emulator, env: Mapping[str, str], *, limit: float, price: float
) -> None:
    """The run stops at `max_cost_usd = limit` (exit 75) having bought no more than it at `price` per 1M tokens;
    raised to 1.0, the reruns finish."""
    code, _, err = tool.run("run", env=dict(env))
    assert code == 75 and "budget reached" in err, err
    assert 0 < emulator.stats()["billed_tokens"] * price / 1e6 <= limit
    tool.config.write_text(
        tool.config.read_text().replace(f"max_cost_usd = {json.dumps(limit)}", "max_cost_usd = 1.0")
    )
    run_to_end(tool, env)
