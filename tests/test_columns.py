"""Columnar documents and tokens keep every column aligned through take, concat and slicing."""

from __future__ import annotations

import numpy as np

from reindex.columns import Documents, TokenColumns, embed, ragged, tokenize
from reindex.ports import Record
from reindex_adapters.testing.memory import HashEmbedder


def test_concat_with_an_empty_shard_keeps_the_texts_and_the_vectors() -> None:
    # Regression: an empty shard's tokens (all copies or dead letters) dropped the `texts` column of the
    # window, and the hash embedder then hashed its keys instead of the texts: wrong vectors, verify complete.
    embedder = HashEmbedder(dim=8, max_tokens=4)
    tokens = tokenize(embedder, ["gamma alpha", "beta"])
    window = TokenColumns.concat([TokenColumns.from_tokens([]), tokens, TokenColumns.from_tokens([])])
    assert window.texts == ["gamma alpha", "beta"]
    np.testing.assert_array_equal(embed(embedder, window)[0], embedder.vector("gamma alpha"))


def test_ragged_ids_survive_take_concat_and_padding() -> None:
    ids, offsets = ragged([[1, 2, 3], [4], [5, 6]])
    tokens = TokenColumns(np.array([3, 1, 2]), np.array([3, 1, 5]), ids, offsets)
    picked = tokens.take([2, 0])
    assert picked.ids is not None and picked.ids.tolist() == [5, 6, 1, 2, 3]
    assert picked.truncated.tolist() == [True, False]
    joined = TokenColumns.concat([tokens, TokenColumns.from_tokens([]), picked])
    assert [t.data for t in joined] == [[1, 2, 3], [4], [5, 6], [5, 6], [1, 2, 3]]
    matrix, mask = tokens.padded(0)
    assert matrix.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]] and mask.sum() == 6
    left, _ = tokens.padded(9, left=True)
    assert left.tolist() == [[1, 2, 3], [9, 9, 4], [9, 5, 6]]


def test_documents_read_back_as_the_records_they_came_from() -> None:
    records = [
        Record("a", "x", {"id": "a", "text": "x", "n": 1}),
        Record("b", "", {}, cursor="7", defect="invalid_json"),
    ]
    docs = Documents.from_records(records)
    assert [r.id for r in docs] == ["a", "b"] and docs[0].payload["n"] == 1
    assert docs.defects == {1: ("invalid_json", "source position 7")} and docs.last_position == "7"
    assert docs.take([1]).defects == {0: ("invalid_json", "source position 7")}
    plain = Documents(["a", "b"], ["x", "y"], fields=("key", "body"))
    assert not plain.has_payload and plain[1].payload == {"key": "b", "body": "y"}
    assert Documents.concat([plain, docs]).payload(2)["n"] == 1
