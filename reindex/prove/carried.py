"""What verify holds of a document besides its text and vector: the parts carried beside it (a Qdrant
point's other named vectors, `Record.carried` / `IndexEntry.carried`) and its payload (`Record.fields` /
`IndexEntry.fields`), each compared where both sides say, and recorded by part in the comparison's
`carried` table (`Category` "carried": sync writes such documents again, their vectors kept)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from reindex.batching import chunks
from reindex.ports import CarryingSink, Sink, Source
from reindex.prove.scratch import load_rows

# the part `Coverage.carried_vectors` counts documents whose payload differs under (no vector has this name)
FIELDS = "(payload)"
CARRIED_CHUNK = 256  # documents whose carried parts the sink compares by value at once

# Documents present on both sides, their text current, whose carried digests differ: candidates, which the
# sink then compares by value (`CarryingSink.carried_differences`).
_CARRIED_CANDIDATES = (
    "SELECT t.id, s.carried, t.carried FROM src s JOIN tgt t ON t.id = s.id"
    " WHERE s.carried IS NOT t.carried AND t.hash IS s.hash AND t.problem IS NULL AND NOT s.conflict"
    " AND t.id NOT IN (SELECT id FROM refuted) ORDER BY 1"
)

# Documents present on both sides, their text current, whose payloads differ where both sides digest theirs
# (`Record.fields`, `IndexEntry.fields`): a field the application set alone, copied by the next sync.
_FIELDS_DIFFER = (
    "INSERT OR IGNORE INTO carried SELECT t.id, ? FROM src s JOIN tgt t ON t.id = s.id"
    " WHERE s.fields IS NOT NULL AND t.fields IS NOT NULL AND s.fields != t.fields AND t.hash IS s.hash"
    " AND t.problem IS NULL AND NOT s.conflict AND t.id NOT IN (SELECT id FROM refuted)"
)


def find_carried(db: sqlite3.Connection, target: str, source: Source, sink: Sink) -> None:
    """Record, by part, the documents whose carried parts the target lacks, holds extra or holds otherwise
    than the source: by digest, then by value where the sink can compare values (a cosine vector
    renormalised on storage differs from its original in the last bit); and those whose payload differs."""
    candidates = {
        doc_id: _differing_parts(source_parts, target_parts)
        for doc_id, source_parts, target_parts in db.execute(_CARRIED_CANDIDATES).fetchall()
    }
    for chunk in chunks(list(candidates.items()), CARRIED_CHUNK):
        parts = dict(chunk)
        if isinstance(sink, CarryingSink):
            parts = sink.carried_differences(target, source, parts)
        rows = ((doc_id, part) for doc_id, names in parts.items() for part in names)
        load_rows(db, "INSERT OR IGNORE INTO carried VALUES (?,?)", rows)
    db.execute(_FIELDS_DIFFER, (FIELDS,))


def parts_json(parts: Mapping[str, str] | None) -> str | None:
    """Digests by part as one comparable column value (None: the side says nothing)."""
    return None if parts is None else json.dumps(dict(parts), sort_keys=True)


def _differing_parts(source_parts: str | None, target_parts: str | None) -> list[str]:
    theirs: dict[str, str] = json.loads(source_parts) if source_parts else {}
    ours: dict[str, str] = json.loads(target_parts) if target_parts else {}
    return sorted(name for name in {*theirs, *ours} if theirs.get(name) != ours.get(name))
