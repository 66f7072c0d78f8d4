"""The claim book: in-flight claims in memory, settled texts in the ledger, set operations in between."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reindex.run.claims import ClaimBook
from reindex.state.sqlite import SqliteLedger

PLAN = "plan-claims"


def test_claims_hold_texts_for_their_owner_until_released(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "state.db")
    ledger.settle_texts(PLAN, [("h3", "written"), ("h4", "written")], owners={"h3": "d9", "h4": "d5"})
    book = ClaimBook(ledger, PLAN)
    assert book.claim({"h1": "d1", "h2": "d2"}) == {}  # new texts: this shard embeds them
    assert book.claim({"h1": "d3", "h2": "d2"}) == {"h1": ("d1", "claimed")}  # the same owner claims again
    assert book.claim({"h3": "d4"}) == {"h3": ("d9", "written")}  # settled by another document
    assert book.claim({"h4": "d5"}) == {"h4": ("d5", "written")}  # its own vector is stored: a self-copy
    assert book.text_states(PLAN, ["h1", "h3", "h9"]) == {"h1": ("d1", "claimed"), "h3": ("d9", "written")}
    book.release(["h1", "h9"])
    assert book.claim({"h1": "d3"}) == {}  # released and not settled: claimed afresh
    assert book.claim({"h1": "d1"}) == {"h1": ("d3", "claimed")}
    ledger.close()


def test_a_claim_made_while_the_ledger_is_asked_wins_over_the_ledgers_answer(tmp_path: Path) -> None:
    class Racing(SqliteLedger):
        """Another shard claims h1 for d7 while this shard's lookup is in the ledger."""

        def text_states(self, plan_id: str, hashes: Sequence[str]) -> dict[str, tuple[str, str]]:
            states = super().text_states(plan_id, hashes)
            if "h2" in hashes:  # this shard's lookup; the other shard's own lookup is of h1 alone
                book.claim({"h1": "d7"})
            return states

    ledger = Racing(tmp_path / "state.db")
    book = ClaimBook(ledger, PLAN)
    assert book.claim({"h1": "d1", "h2": "d2"}) == {"h1": ("d7", "claimed")}
    assert book.text_states(PLAN, ["h1", "h2"]) == {"h1": ("d7", "claimed"), "h2": ("d2", "claimed")}
    ledger.close()


def test_a_claim_in_the_ledger_that_the_book_does_not_hold_is_no_ones_to_wait_for(tmp_path: Path) -> None:
    """A stopped ray run leaves claims in the ledger that only its rerun fulfils: a pipeline with a book
    (sync, dlq retry) reads them as nobody's, so a copy of such a text is embedded, not waited for."""
    ledger = SqliteLedger(tmp_path / "state.db")
    assert ledger.claim_texts(PLAN, {"h1": "d1", "h2": "d2"}) == {}  # a ray actor's claims, left behind
    book = ClaimBook(ledger, PLAN)
    assert book.claim({"h2": "d3"}) == {"h2": ("d2", "claimed")}  # still held against new claims
    assert book.claim({"h3": "d4"}) == {}
    assert book.text_states(PLAN, ["h1", "h2", "h3"]) == {"h3": ("d4", "claimed")}
    ledger.close()
