"""Token-budget batching: nothing lost or duplicated, budgets kept, lengths sorted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reindex.batching import padded_tokens, token_batches


@given(
    st.lists(st.integers(min_value=0, max_value=600), max_size=400),
    st.integers(min_value=1, max_value=5000),
    st.integers(min_value=1, max_value=64),
)
def test_every_index_lands_in_exactly_one_batch_within_budget(lengths, budget, max_batch):
    batches = token_batches(lengths, budget, max_batch)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= max_batch
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= budget


def test_short_and_long_texts_never_share_a_batch():
    lengths = [10, 500, 12, 480, 11, 490]
    batches = token_batches(lengths, budget=1500, max_batch=64)
    assert [sorted(lengths[i] for i in b) for b in batches] == [[10, 11, 12], [480, 490, 500]]
    assert padded_tokens(lengths, batches) == 3 * 12 + 3 * 500
