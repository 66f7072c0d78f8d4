"""Qdrant aliases: reading them, and moving one by compare-and-swap on its guard alias.

Each alias has a guard alias `<alias>__reindex_serves__<target>` that makes its moves compare-and-swap;
guards are the tool's own bookkeeping, never served aliases or targets.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from reindex import crashpoints
from reindex.errors import BackendError, CutoverRefused, ReindexError, TransientError
from reindex.ports import AliasInfo
from reindex_adapters.qdrant.connection import NAME_MAX, is_local, translated

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

    from reindex.ports import TargetInfo
    from reindex_adapters.qdrant.targets import Collections

# `<alias>__reindex_serves__<target>`: the guard alias that makes alias moves compare-and-swap (move_alias)
GUARD_MARK = "__reindex_serves__"
ALIAS_MAX = NAME_MAX - len(GUARD_MARK) - 16  # its guard alias, `_guard` hashed past the limit, must fit
_local_moves = threading.Lock()  # serialises alias moves on local storage (see QdrantSink.move_alias)


class AliasMoves:
    """QdrantSink's alias side: what an alias serves, and moving it; the sink gives its collections, how it
    describes a target, and its rollback's carry-back."""

    def __init__(
        self,
        collections: Collections,
        describe: Callable[[str], TargetInfo | None],
        carry_back: Callable[..., dict[Any, tuple[str, Any]]],
        move_lock: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.collections = collections
        self.describe = describe
        self.carry_back = carry_back
        self.move_lock = move_lock  # held around a move's compare-and-swap (`local_move_lock`)

    def alias(self, alias: str) -> AliasInfo:
        if alias in self.collections.names():
            return AliasInfo(alias, None, is_physical=True)
        target = self.collections.aliases().get(alias)
        if target is None:
            return AliasInfo(alias, None)
        info = self.describe(target)
        return AliasInfo(
            alias, target, fingerprint=info.fingerprint if info else None, model=info.model if info else None
        )

    def move_alias(
        self,
        alias: str,
        target: str,
        *,
        expected: str | None,
        meta: Mapping[str, Any],
        settle: Callable[[], None] | None = None,
    ) -> str | None:
        """Compare-and-swap in ONE update_collection_aliases call, then read back. Qdrant cannot hold
        writers back: `settle` runs right before the call. A rollback carries what the application wrote
        into the collection it leaves back into `target`, before the call and again after (rollback.py).

        The guard alias `<alias>__reindex_serves__<expected>` is the token: the call first renames it
        to the new target's guard, and a rename of a missing alias fails the whole call before any
        action is applied, so of two movers expecting the same target only the first gets through
        (a server applies a call's actions in order under its alias lock; deleting a missing alias
        would succeed, so it cannot be the check). Local mode holds one process-wide lock instead:
        its update is a read-modify-write of a dict that two threads can interleave, older
        qdrant-client releases apply a call's actions one by one, and its storage has one owning
        process anyway. Qdrant aliases carry no metadata: the target's collection metadata answers
        for `meta`.
        """
        collections = self.collections.names()
        if alias in collections:
            raise CutoverRefused(_physical_alias_message(alias))
        if target not in collections:
            raise CutoverRefused(f"target collection {target!r} does not exist")
        rolling_back = meta.get("action") == "rollback" and expected is not None
        carried = self.carry_back(expected, target) if rolling_back and expected is not None else None
        if settle is not None:
            settle()
        with self.move_lock():
            guards = self._claim(alias, target, expected)
            crashpoints.crash_if_armed("cutover_before_commit")
            try:
                with translated():
                    self.collections.client.update_collection_aliases(
                        change_aliases_operations=_swap(alias, target, expected, guards)
                    )
            except ReindexError as exc:
                self._after_failed_swap(alias, target, expected, exc)
        self._read_back(alias, target)
        if carried is not None and expected is not None:  # what reached the newer one meanwhile
            self.carry_back(expected, target, since=carried)
        return expected

    def _after_failed_swap(self, alias: str, target: str, expected: str | None, exc: ReindexError) -> None:
        """A refused call moved nothing: CutoverRefused if the guard is gone (another mover won).

        A transient failure may have been applied before the answer was lost: then the read-back decides.
        """
        aliases = self.collections.aliases()
        if isinstance(exc, TransientError) and aliases.get(alias) == target:
            return
        if aliases.get(alias) != expected or _guard(alias, expected) not in aliases:
            raise _moved(alias, aliases.get(alias), expected) from exc
        raise exc

    def _claim(self, alias: str, target: str, expected: str | None) -> list[str]:
        """Check the alias serves `expected` and make sure its guard exists; return the alias's guards.

        An alias without a guard (the first move, or one made by an older version or by hand) is
        adopted: its guard is created first, then the alias is read again; a mover that lost a race
        meanwhile finds the alias moved and removes the guard it made, so it can only fail others.
        """
        aliases = self.collections.aliases()
        current = aliases.get(alias)
        if current != expected:
            raise _moved(alias, current, expected)
        guard = _guard(alias, expected)
        if guard in aliases:
            return _guards_of(alias, aliases)
        with translated():
            self.collections.client.update_collection_aliases(
                change_aliases_operations=[_create_alias(guard, target if expected is None else expected)]
            )
        aliases = self.collections.aliases()
        if aliases.get(alias) != expected:
            with translated():
                self.collections.client.update_collection_aliases(
                    change_aliases_operations=[_delete_alias(guard)]
                )
            raise _moved(alias, aliases.get(alias), expected)
        return _guards_of(alias, aliases)

    def _read_back(self, alias: str, target: str) -> None:
        aliases = self.collections.aliases()
        if aliases.get(alias) != target or aliases.get(_guard(alias, target)) != target:
            raise BackendError(
                f"alias {alias!r} does not point to {target!r} after the swap",
                hint="inspect the aliases on the server and rerun cutover",
            )


def local_move_lock(client: QdrantClient) -> AbstractContextManager[Any]:
    """One process-wide lock around moves on local storage (see `move_alias`); none for a server."""
    return _local_moves if is_local(client) else nullcontext()


def _physical_alias_message(alias: str) -> str:
    return (
        f"{alias!r} is a real Qdrant collection and Qdrant cannot put an alias over a collection: "
        f"point the application at an alias first (create alias '{alias}_live' -> '{alias}', read "
        f"'{alias}_live', then cut over '{alias}_live'), or reindex under a new name and delete '{alias}' "
        "before cutting over (readers fail in between)"
    )


def _moved(alias: str, current: str | None, expected: str | None) -> CutoverRefused:
    return CutoverRefused(
        f"alias {alias!r} points to {current!r}, expected {expected!r}",
        hint="someone moved it meanwhile: check `reindex status` before retrying",
    )


def _guard(alias: str, served: str | None) -> str:
    """The guard alias saying `alias` serves `served` ('' for no target yet); hashed past Qdrant's limit."""
    name = f"{alias}{GUARD_MARK}{served or ''}"
    if len(name) <= NAME_MAX:
        return name
    return f"{alias}{GUARD_MARK}{hashlib.sha256((served or '').encode()).hexdigest()[:16]}"


def _guards_of(alias: str, aliases: Mapping[str, str]) -> list[str]:
    return [name for name in aliases if name.startswith(f"{alias}{GUARD_MARK}")]


def _swap(alias: str, target: str, expected: str | None, guards: Sequence[str]) -> list[Any]:
    """The compare (a rename that fails if the expected guard is gone) first, so a refusal applies
    nothing even where a server applies the actions one by one; then the move, then the guards."""
    from qdrant_client import models

    new_guard = _guard(alias, target)
    compare = models.RenameAliasOperation(
        rename_alias=models.RenameAlias(old_alias_name=_guard(alias, expected), new_alias_name=new_guard)
    )
    stale = [_delete_alias(g) for g in guards if g not in (new_guard, _guard(alias, expected))]
    move = [_delete_alias(alias)] if expected is not None else []
    return [compare, *move, _create_alias(alias, target), _create_alias(new_guard, target), *stale]


def _create_alias(alias: str, collection: str) -> Any:
    from qdrant_client import models

    return models.CreateAliasOperation(
        create_alias=models.CreateAlias(collection_name=collection, alias_name=alias)
    )


def _delete_alias(alias: str) -> Any:
    from qdrant_client import models

    return models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
