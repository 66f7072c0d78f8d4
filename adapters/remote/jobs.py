"""Creating a provider batch job once for a deterministic key, and adopting the job when a create that failed
was made anyway (the openai-batch, mistral-batch, gemini-batch and bedrock-batch embedders)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from reindex.errors import TransientError
from reindex_adapters.remote.errors import ProviderBusy

J = TypeVar("J")


def create_once(
    create: Callable[[], J],
    find: Callable[[], J | None],
    *,
    what: str,
    unsure: tuple[type[Exception], ...] = (ProviderBusy,),
) -> J:
    """`create()` once, never retried: a second create could bill twice. When it fails without saying whether
    the job was made (a timeout or 5xx: ProviderBusy, or another of `unsure`), adopt the job `find()` returns
    (the job carrying the key); with none, raise TransientError, so that a rerun finds or creates it.

    Callers look the key up with the same `find` before uploading anything, which adopts a job a crashed run
    created; `what` names the job in the error ("the batch for key 'k'").
    """
    try:
        return create()
    except unsure as exc:
        found = find()
        if found is None:
            raise TransientError(f"creating {what} failed: {exc}; rerun to retry") from exc
        return found


class KeyIndex(Generic[J]):
    """A provider's batches by the key each carries, from its newest-first listing: read whole once per
    process, then on each lookup only as far as the first batch already seen. A run of N jobs then lists
    about N pages, not N times every page (the listings have no metadata filter: OpenAI's and Voyage's take
    only `limit` and `after`, and list newest first).

    `pages()` yields the listing's pages, newest first; `key_of` reads a batch's key (None: not ours);
    `worth` says whether a batch may be adopted (not one that failed). A batch's status is as last listed:
    one adopted and failed since is found so by its poll, whose lines are then sent again."""

    def __init__(
        self,
        pages: Callable[[], Iterator[Sequence[J]]],
        *,
        id_of: Callable[[J], str],
        key_of: Callable[[J], str | None],
        worth: Callable[[J], bool],
    ) -> None:
        self._pages, self._id_of, self._key_of, self._worth = pages, id_of, key_of, worth
        self._seen: set[str] = set()
        self._by_key: dict[str, list[J]] = {}
        self.listed_pages = 0  # pages read so far (tests, and the run's request counts)

    def find(self, key: str) -> J | None:
        """The newest adoptable batch carrying `key`, after reading what was listed since the last look."""
        self._refresh()
        return next((batch for batch in self._by_key.get(key, []) if self._worth(batch)), None)

    def _refresh(self) -> None:
        fresh: list[J] = []
        for page in self._pages():
            self.listed_pages += 1
            unseen = [batch for batch in page if self._id_of(batch) not in self._seen]
            fresh += unseen
            if len(unseen) < len(page):  # reached what an earlier look read: the rest is older
                break
        grouped: dict[str, list[J]] = {}
        for batch in fresh:
            self._seen.add(self._id_of(batch))
            key = self._key_of(batch)
            if key is not None:
                grouped.setdefault(key, []).append(batch)
        for key, batches in grouped.items():
            self._by_key[key] = batches + self._by_key.get(key, [])
