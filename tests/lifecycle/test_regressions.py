"""One named regression per defect of issue 10 that the memory backends can show through `reindex.commands`.

Each test states the spec; `support.World.served_problems` compares a target with a fresh migration of the
current source, id by id and vector by vector.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from reindex import commands, registry
from reindex.columns import TokenColumns
from reindex.config import load
from reindex.errors import BackendError, ConfigError, Interrupted, VerificationFailed
from reindex.ports import Vectors
from reindex.run.pipeline import Progress
from reindex_adapters.testing import memory
from reindex_adapters.testing.memory import HashEmbedder
from tests.lifecycle.support import ALIAS, NUL_REASON, Knobs, World


@pytest.fixture
def world() -> Iterator[World]:
    built = World()
    yield built
    built.close()


def level(world: World, seed: str = "A") -> None:
    """verify says complete, and the target is exactly a fresh migration of the current source."""
    coverage = commands.verify(world.config(seed))
    assert coverage.complete, coverage.problems()
    assert world.served_problems(seed) == []


# 1. sync and dlq retry lose documents whose text another document carries ---------------------------------


def test_sync_writes_a_new_document_whose_text_another_document_carries(world: World) -> None:
    world.store.put("a", "alpha beta")
    world.store.put("b", "gamma")
    commands.run(world.config())
    world.store.put("c", "alpha beta")  # after the run: only sync sees it
    commands.sync(world.config())
    level(world)
    assert commands.sync(world.config()).added == 0


def test_dlq_retry_writes_a_document_whose_text_another_document_carries(world: World) -> None:
    world.reject_nul = True
    world.store.put("a", "alpha beta")
    world.store.put("b", "alpha \x00 beta")
    commands.run(world.config())
    assert [d["doc_id"] for d in commands.dlq_list(world.config()).dead_letters] == ["b"]
    world.store.edit("b", "alpha beta")  # the application fixes the poison text: now a's text
    commands.dlq_retry(world.config())
    level(world)
    world.reconciled(world.config())


# 2. a copy can carry another text's vector -----------------------------------------------------------------


def test_copy_never_takes_the_vector_of_an_owner_whose_text_was_edited(world: World) -> None:
    world.store.put("a", "alpha beta")
    world.store.put("b", "gamma")
    commands.run(world.config())
    world.store.edit("a", "delta")
    commands.sync(world.config())  # a now stores the vector of "delta"
    world.store.put("e", "alpha beta")  # a's old text, beyond the run's cursor
    commands.run(world.config())
    coverage = commands.verify(world.config())
    if coverage.complete:
        assert world.served_problems("A") == []
    commands.sync(world.config())
    level(world)


# 3. verify calls an empty target complete; a wrong-dimension model dead-letters everything -----------------


def test_verify_is_not_complete_when_dead_letters_exceed_the_ceiling(world: World) -> None:
    world.too_long, world.max_dead_letters = "dead-letter", 0.01
    for i in range(5):
        world.store.put(f"d{i}", "alpha beta gamma alpha beta gamma")  # over max_tokens: all dead
    commands.run(world.config())
    coverage = commands.verify(world.config())
    assert not coverage.complete
    with pytest.raises(VerificationFailed) as refused:
        commands.cutover(world.config())
    assert refused.value.exit_code == 3
    assert ALIAS not in world.store.aliases


def test_verify_is_complete_when_dead_letters_stay_within_the_ceiling(world: World) -> None:
    world.too_long, world.max_dead_letters = "dead-letter", 1
    world.store.put("long", "alpha beta gamma alpha beta gamma")
    world.store.put("short", "alpha")
    commands.run(world.config())
    level(world)
    assert not commands.verify(world.config(max_dead_letters=0)).complete


class WrongDimensionEmbedder(HashEmbedder):
    """Declares `dim` but returns one column more, like a model swapped under an unchanged config."""

    class Config(HashEmbedder.Config):
        kind: str  # type: ignore[assignment]

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        vectors = super().embed_columns(tokens)
        return np.hstack([vectors, vectors[:, :1]])


@pytest.fixture
def wrong_dimension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.EMBEDDERS, "wrong-dim", f"{__name__}:WrongDimensionEmbedder")


def test_embedder_of_the_wrong_dimension_fails_the_run_with_exit_2(
    world: World, wrong_dimension: None
) -> None:
    for i in range(5):
        world.store.put(f"d{i}", f"alpha {i}")
    config = world.config()
    path = config.path
    path.write_text(path.read_text().replace('kind = "hash"', 'kind = "wrong-dim"'))
    with pytest.raises(ConfigError) as failed:
        commands.run(load(path))
    assert failed.value.exit_code == 2
    assert commands.dlq_list(load(path)).total == 0  # nothing dead-lettered as non_finite_vector


# 5. one poison document fails the whole run ----------------------------------------------------------------


def test_a_nul_in_one_document_dead_letters_it_and_the_others_land(world: World) -> None:
    world.reject_nul = True
    for i in range(6):
        world.store.put(f"d{i}", f"alpha {i}")
    world.store.put("d3", "alpha \x00 beta")
    report = commands.run(world.config())
    assert report.reconciled and report.dead_letter_reasons == {NUL_REASON: 1}
    level(world)


# 6. migration identity is the raw config -------------------------------------------------------------------


def stopped_after_one_shard(world: World, seed: str = "A") -> None:
    stop = threading.Event()

    def on_progress(progress: Progress) -> None:
        stop.set()

    with pytest.raises(Interrupted):
        commands.run(world.config(seed), stop=stop, on_progress=on_progress)


def test_changing_shard_size_resumes_the_same_migration(world: World) -> None:
    for i in range(60):
        world.store.put(f"d{i:02}", f"alpha {i}")
    # One shard per window and per queue slot: what is in flight when the stop comes (and lands) stays
    # well short of the 60 documents, however fast the stages are.
    world.knobs["A"] = Knobs(shard_size=3, queue_depth=1, sort_window=3)
    stopped_after_one_shard(world)
    before = commands.status(world.config())
    assert 0 < before.documents < 60
    world.knobs["A"].shard_size, world.knobs["A"].queue_depth, world.knobs["A"].sort_window = 5, 3, 2
    after = commands.status(world.config())
    assert (after.plan_id, after.documents) == (before.plan_id, before.documents)
    resumed: list[int] = []
    commands.run(world.config(), on_start=lambda total, done: resumed.append(done))
    assert resumed == [before.documents]
    level(world)
    world.reconciled(world.config())


def test_a_target_someone_dropped_is_not_resumed(world: World) -> None:
    for i in range(9):
        world.store.put(f"d{i}", f"alpha {i}")
    stopped_after_one_shard(world)
    del world.store.targets[world.target("A")]
    del world.store.specs[world.target("A")]
    with pytest.raises(ConfigError) as refused:
        commands.run(world.config())
    assert refused.value.exit_code == 2 and "--fresh" in str(refused.value)
    commands.run(world.config(), fresh=True)
    level(world)


def test_the_same_config_pointed_at_another_store_starts_its_own_migration(world: World) -> None:
    for i in range(9):
        world.store.put(f"d{i}", f"alpha {i}")
    stopped_after_one_shard(world)
    other = World(root=world.root)  # same ledger file, another store: another source and target
    try:
        for i in range(9):
            other.store.put(f"d{i}", f"beta {i}")
        assert commands.status(other.config()).plan_id != commands.status(world.config()).plan_id
        commands.run(other.config())
        level(other)
    finally:
        memory.forget_store(other.store_name)


# 11. every command loads the model -------------------------------------------------------------------------


class ModelThatMustNotLoad(HashEmbedder):
    """The `hash` kind, except that building it fails: commands that need no model must not build it."""

    @classmethod
    def from_config(cls, config: HashEmbedder.Config) -> HashEmbedder:
        raise AssertionError("the model was loaded")


def test_status_rollback_and_dlq_list_do_not_load_the_model(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.reject_nul = True
    for i in range(6):
        world.store.put(f"d{i}", f"alpha {i}")
    world.store.put("poison", "alpha \x00")
    world.max_dead_letters = 1
    for seed in ("A", "B"):
        commands.run(world.config(seed))
        commands.cutover(world.config(seed))
    monkeypatch.setitem(registry.EMBEDDERS, "hash", f"{__name__}:ModelThatMustNotLoad")
    config = world.config("B")
    assert commands.status(config).is_live
    assert commands.dlq_list(config).total == 1
    moved = commands.rollback(config)
    assert moved.target == world.target("A") == world.store.aliases[ALIAS][0]
    commands.prune(config, keep=2)


# found by the lifecycle model (tests/lifecycle/test_model.py) against the issue-10 core ---------------------


def test_sync_removes_the_vector_of_a_document_edited_into_a_dead_letter(world: World) -> None:
    """A written document whose text becomes empty or poison: sync dead-letters it, and its old vector
    (of a text it no longer has) must go, or verify stays `stale` forever and no sync fixes it."""
    world.reject_nul, world.max_dead_letters = True, 2
    world.store.put("d00", "alpha")
    world.store.put("d01", "gamma")
    world.store.put("d02", "beta")
    commands.run(world.config())
    world.store.edit("d00", "")
    world.store.edit("d01", "alpha \x00")
    commands.sync(world.config())
    level(world)


def test_verify_sees_a_second_record_with_an_existing_id(world: World) -> None:
    """A source may hold one id twice with different texts (a JSONL file): a fresh migration dead-letters
    both, so verify must not call a target holding one of them complete."""
    world.store.put("d00", "alpha")
    world.store.put("d01", "gamma")
    commands.run(world.config())
    world.store.append("d00", "beta")
    coverage = commands.verify(world.config())
    assert not coverage.complete or world.served_problems("A") == []


def test_a_duplicate_id_split_across_shards_ends_dead_lettered_after_sync(world: World) -> None:
    world.knobs["A"] = Knobs(shard_size=1)
    world.store.put("d00", "alpha")
    world.store.append("d00", "beta")
    world.store.put("d01", "gamma")
    commands.run(world.config())
    commands.sync(world.config())
    level(world)


# found by the deferred lifecycle model (DeferredLifecycle: the memory-batch provider) ----------------------


def batch_world(world: World) -> World:
    world.embedder_kind, world.reject = "memory-batch", "omega"
    world.store.put("a", "alpha")
    world.store.put("b", "beta")
    commands.run(world.config())
    level(world)
    return world


def test_sync_with_a_batch_embedder_embeds_a_new_document(world: World) -> None:
    """Sync (and `cutover --sync`) build the inline pipeline, which calls `embed`: a batch embedder
    (memory-batch, openai-batch) has none, so the first sync with anything to embed crashes."""
    batch_world(world)
    world.store.put("c", "gamma")
    commands.sync(world.config())
    level(world)


def test_dlq_retry_with_a_batch_embedder_retries_the_dead_letters(world: World) -> None:
    batch_world(world)
    world.store.put("c", "gamma omega")  # refused by the provider: provider_rejected:invalid_request
    commands.sync(world.config())
    world.store.edit("c", "gamma")  # the application fixes it
    commands.dlq_retry(world.config())
    level(world)
    world.reconciled(world.config())


def test_sync_while_a_failed_batch_runs_jobs_are_open_refuses_instead_of_paying_twice(world: World) -> None:
    """A batch run failed at its first write after the provider had billed the job; sync then embedded the
    same texts again (billed twice). It now refuses, naming `reindex run`, which collects the job."""
    world.embedder_kind, world.reject = "memory-batch", "omega"
    world.store.put("a", "alpha")
    world.store.put("b", "alpha")
    world.store.fail_write(1)
    with pytest.raises(BackendError):
        commands.run(world.config())
    world.store.fail_write(None)
    billed = world.store.provider.billed_tokens
    with pytest.raises(ConfigError, match="still open") as refused:
        commands.sync(world.config())
    assert refused.value.exit_code == 2 and "reindex run" in str(refused.value.hint)
    assert world.store.provider.billed_tokens == billed
    commands.run(world.config())
    assert world.store.provider.billed_tokens == billed  # the run collected the job it had paid for
    commands.sync(world.config())
    level(world)


def test_a_run_after_sync_does_not_pay_again_for_what_sync_wrote_past_its_cursor(world: World) -> None:
    """Sync embedded a document the run had not read yet; the next run read it, found its text settled
    with that very document as owner, claimed it again and paid the provider a second time."""
    batch_world(world)
    world.store.put("c", "gamma delta")  # past the run's cursor: sync writes it, then the run reads it
    commands.sync(world.config())
    billed = world.store.provider.billed_tokens
    assert commands.run(world.config()).reconciled
    assert world.store.provider.billed_tokens == billed
    level(world)
    world.store.edit("c", "gamma")  # its vector must still follow its text
    commands.sync(world.config())
    level(world)


def test_a_text_whose_nul_the_sink_refuses_is_not_paid_for_again_by_its_copies(world: World) -> None:
    """A NUL in the text makes the sink refuse every row that carries it. The inline path (dlq retry,
    sync) marked such a text lost, so a later document with the same text paid the provider again for a
    vector no row can hold (found by the deferred lifecycle model)."""
    world.reject_nul = True
    batch_world(world)
    world.store.put("n1", "alpha \x00 beta")
    commands.run(world.config())
    world.store.put("n2", "alpha \x00 beta")  # the same text, past the run's cursor
    commands.dlq_retry(world.config())  # the operator pays once more for n1: allowed
    billed = world.store.provider.billed_tokens
    commands.run(world.config())
    assert world.store.provider.billed_tokens == billed, "n2 paid again for a text no row can hold"
    letters = {d["doc_id"]: d["reason"] for d in commands.dlq_list(world.config()).dead_letters}
    assert letters == {"n1": NUL_REASON, "n2": NUL_REASON}
    world.reconciled(world.config())


class RateLimitedOnce(HashEmbedder):
    """The `hash` kind, except that its first batch comes back refused with a 429 for every input."""

    refuse = True

    class Config(HashEmbedder.Config):
        kind: str  # type: ignore[assignment]

    def embed_columns(self, tokens: TokenColumns) -> Vectors:
        self.refused = len(tokens) if RateLimitedOnce.refuse else 0
        RateLimitedOnce.refuse = False
        return super().embed_columns(tokens)

    def last_rejections(self) -> dict[int, str]:
        return dict.fromkeys(range(self.refused), "provider_rejected:429")


def test_sync_retries_documents_dead_lettered_for_a_transient_provider_fault(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify does not excuse a transient dead letter (a 429, an expired batch line): a fresh migration
    would embed the text. Sync treats every dead letter as excused, so it leaves such a document
    missing, and verify stays incomplete after any number of syncs."""
    monkeypatch.setitem(registry.EMBEDDERS, "rate-limited", f"{__name__}:RateLimitedOnce")
    monkeypatch.setattr(RateLimitedOnce, "refuse", True)
    world.store.put("a", "alpha")
    config = world.config()
    config.path.write_text(config.path.read_text().replace('kind = "hash"', 'kind = "rate-limited"'))
    commands.run(load(config.path))
    assert commands.dlq_list(load(config.path)).reasons == {"provider_rejected:429": 1}
    commands.sync(load(config.path))
    coverage = commands.verify(load(config.path))
    assert coverage.complete, coverage.problems()


# found by the lifecycle model on Qdrant local (QdrantLifecycle) ----------------------------------------------


def test_sync_on_qdrant_with_nothing_dead_lettered_does_not_fail() -> None:
    """Sync deletes the vectors of a shard's dead letters even when there are none: `sink.delete(target,
    [])`, which Qdrant refuses ("Empty update request"), so any sync that embeds something fails on Qdrant."""
    world = World(backend="qdrant")
    try:
        world.docs.put("d00", "alpha")
        commands.run(world.config())
        world.docs.put("d01", "beta")
        commands.sync(world.config())
        level(world)
    finally:
        world.close()


def test_a_fresh_run_never_adopts_a_provider_batch_of_the_run_it_forgot(world: World) -> None:
    """`run --fresh` forgets the ledger's jobs, but the provider keeps their batches under their keys. A
    first job's key was `<plan>-<seq>-0` whatever the run, so the fresh run's first job adopted the
    forgotten run's batch and wrote the vector of a document's old text under its new hash; verify,
    which compares hashes, said complete. Found by the deferred lifecycle model."""
    batch_world(world)
    world.store.edit("a", "alpha  beta")  # after the run: the old batch holds the vector of "alpha"
    commands.run(world.config(), fresh=True)
    level(world)


def test_a_self_copy_survives_a_stale_claim_of_its_owner_on_another_text(world: World) -> None:
    """The ledger still named d00 as the owner of its old text "alpha beta", which d02 copied from it while d00
    still carried it; then d00 was re-embedded for its new text "beta". The next run met both as copies of
    d00, and the stored-hash check was keyed by owner, so one expectation overwrote the other: d00's own,
    valid vector counted as lost and the provider billed "beta" twice. d02 was embedded again too, though it
    already stored the vector of its text. Found by the deferred lifecycle model."""
    world.embedder_kind, world.reject, world.polls_to_finish = "memory-batch", "omega", 1
    world.knobs = {"A": Knobs(shard_size=3)}
    commands.run(world.config())  # an empty source: the run's cursor stays at the start
    world.store.put("d00", "alpha beta")
    commands.sync(world.config())  # d00 owns "alpha beta" in the ledger
    world.store.put("d01", "alpha")
    world.store.edit("d00", "beta")
    world.store.put("d02", "alpha beta")
    world.store.put("d03", "alpha alpha")
    commands.sync(world.config())  # missing ones first: d02 copies d00's vector, then d00 gets "beta"
    billed = Counter(bill.text for bill in world.store.provider.bills)
    assert commands.run(world.config()).reconciled  # one shard holds d00, d01 and d02
    assert Counter(bill.text for bill in world.store.provider.bills) == billed
    level(world)


def test_a_run_does_not_pay_again_for_a_text_sync_dead_lettered_past_its_cursor(world: World) -> None:
    """Sync embedded a document the run had not read yet, and the sink refused its row for the NUL its text
    holds. The next run read it, found the text dead with that very document as owner, claimed it again
    and paid the provider a second time for a row no sink of this kind can store. Found by the deferred
    lifecycle model."""
    world.embedder_kind, world.reject, world.polls_to_finish = "memory-batch", "omega", 1
    commands.run(world.config())  # an empty source: the run's cursor stays at the start
    world.store.put("d00", "alpha \x00 beta")
    commands.sync(world.config())
    billed = Counter(bill.text for bill in world.store.provider.bills)
    assert billed == Counter({"alpha \x00 beta": 1})
    assert commands.run(world.config()).reconciled
    assert Counter(bill.text for bill in world.store.provider.bills) == billed
    letters = commands.dlq_list(world.config()).dead_letters
    assert [(letter["doc_id"], letter["reason"]) for letter in letters] == [("d00", NUL_REASON)]
    level(world)
