"""Cohere datasets as Embed Jobs use them: the `embed-input` file uploaded for a job, finding a dataset again by
its name over every page of the listing, reading a dataset's rows, and the rows its validation dropped.

A dataset is read as the SDK's `co.utils.save_dataset` reads it (cohere/utils.py, `dataset_generator`): each of
its `dataset_parts` is an Avro file at a download `url`. The download here checks the HTTP status first (the
SDK hands any answer to the Avro reader), so a part gone or a URL expired reads as "gone", not as garbage.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reindex.ports import JobItem
from reindex_adapters.cohere.client import Api
from reindex_adapters.remote.errors import ProviderBusy, ProviderNotFound, retry_after

if TYPE_CHECKING:
    import httpx
    from cohere import Dataset, DatasetsGetResponse

INPUT_TYPE = "embed-input"
ID_FIELD = "reindex_id"  # each row's custom_id, kept through to the output (`keep_fields`)
VALIDATING = frozenset({"queued", "processing"})  # then "validated", else refused ("failed", "skipped", ...)
PAGE = 100
LINE = re.compile(r"\s*\(?\bline:?\s*(\d+)\)?:?", re.IGNORECASE)  # "(line: 3)", "line 3:" in a warning


def upload_name(key: str) -> str:
    """The dataset's and the job's name: the key's digest (dataset names must be under 50 characters)."""
    return f"reindex-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def input_file(items: Sequence[JobItem]) -> bytes:
    """One JSON line per input, `{"text", "reindex_id"}`: line N is items[N - 1]. ASCII only (`\\uXXXX`
    escapes), so no Unicode line separator inside a text can split a line for a parser and shift the line
    numbers validation warnings give."""
    lines = (json.dumps({"text": str(item.tokens.data), ID_FIELD: item.custom_id}) for item in items)
    return "".join(f"{line}\n" for line in lines).encode()


def find(api: Api, name: str) -> Dataset | None:
    """The embed-input dataset named `name`, page after page of the listing until it is found or the pages run
    out (one name is one key: there is at most one, unless a create that failed was made anyway and missed).

    The listing is filtered by type; each dataset's own type and name are checked too, so a server that
    ignored the filter costs pages, not a second dataset."""
    for page in pages(api):
        found = [d for d in page if d.name == name and d.dataset_type == INPUT_TYPE]
        if found:
            return max(found, key=lambda dataset: dataset.created_at)
    return None


def pages(api: Api) -> Iterator[list[Dataset]]:
    for offset in range(0, 10**9, PAGE):
        listing = functools.partial(
            api.client.datasets.list, dataset_type=INPUT_TYPE, limit=PAGE, offset=offset
        )
        page = api.call(listing).datasets or []
        yield page
        if len(page) < PAGE:
            return


def create(api: Api, name: str, content: bytes, timeout_s: float) -> str:
    """Upload the input once (never retried: the caller adopts by name after an uncertain create). Malformed
    rows are dropped with a warning instead of failing the whole dataset (`skip_malformed_input`)."""
    request = functools.partial(
        api.client.datasets.create,
        name=name,
        type=INPUT_TYPE,
        data=(f"{name}.jsonl", content, "application/jsonl"),
        keep_fields=[ID_FIELD],
        skip_malformed_input=True,
        request_options={"timeout": timeout_s, "max_retries": 0},
    )
    created = api.once(request)
    return str(created.id)


def get(api: Api, dataset_id: str) -> Dataset | None:
    """The dataset, or None once deleted."""
    try:
        response: DatasetsGetResponse = api.call(functools.partial(api.client.datasets.get, dataset_id))
    except ProviderNotFound:
        return None
    return response.dataset


def rows(api: Api, dataset: Dataset, timeout_s: float) -> list[dict[str, Any]] | None:
    """Every row of every part, or None when a part is gone (deleted, or its URL expired). The parts are
    signed URLs: fetched without the API key, by a client that lives as long as this read."""
    import fastavro
    import httpx

    found: list[dict[str, Any]] = []
    with httpx.Client(timeout=timeout_s) as http:
        for part in dataset.dataset_parts or []:
            if not part.url:
                return None
            try:
                content = api.call(functools.partial(download, http, part.url))
            except ProviderNotFound:
                return None
            found += [row for row in fastavro.reader(io.BytesIO(content)) if isinstance(row, dict)]
    return found


def download(http: httpx.Client, url: str) -> bytes:
    import httpx

    try:
        response = http.get(url)
    except httpx.TransportError as exc:
        raise ProviderBusy(f"downloading a dataset part: {type(exc).__name__}") from None
    status = response.status_code
    if status == 429 or status >= 500:
        headers = {key.lower(): value for key, value in response.headers.items()}
        raise ProviderBusy(
            f"downloading a dataset part: HTTP {status}", retry_after=retry_after(headers), status=status
        )
    if status >= 400:  # 403/404/410: deleted, or the signed URL expired
        raise ProviderNotFound(f"dataset part gone (HTTP {status})", hint="the dataset was deleted")
    return response.content


def dropped(warnings: Sequence[str], order: Sequence[str]) -> dict[str, str]:
    """custom_id -> Cohere's reason, for the rows validation dropped: each warning naming a line of the upload
    (line N is order[N - 1]); its text, the line reference taken out, is the reason. Warnings naming no line
    are not guessed at: their rows come back missing (and are sent again)."""
    reasons: dict[str, str] = {}
    for warning in warnings:
        match = LINE.search(warning)
        number = int(match.group(1)) if match else 0
        if 1 <= number <= len(order):
            reasons.setdefault(order[number - 1], reason_of(LINE.sub("", warning, count=1)))
    return reasons


def reason_of(text: str) -> str:
    """One line, at most 120 characters: a reason that groups well in `dlq list`."""
    return " ".join(text.split()).strip(" :;,.")[:120] or "dropped"


def ids_of(found: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(row[ID_FIELD]) for row in found if row.get(ID_FIELD) is not None]
