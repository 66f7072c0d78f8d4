"""Load and validate a migration's TOML file once; the sections go to the adapters by kind."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from reindex import registry
from reindex.capabilities import NamesModelPaths, NamesPaths
from reindex.errors import ConfigError, environment, validate
from reindex.ports import Section, TargetSection
from reindex.registry import Role

SECTIONS = ("source", "embedder", "target", "run", "ray", "compare", "gate", "routes")
DURATION_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(min|s|m|h|d)")


def duration_seconds(text: str) -> float:
    """`"90m"`, `"6h"`, `"2d"`, `"1d12h"` in seconds; anything else is a ValueError naming the forms."""
    compact = text.strip().lower()
    parts = DURATION_PART.findall(compact)
    if not compact or "".join(DURATION_PART.sub("", compact).split()) or not parts:
        raise ValueError(f'{text!r} is not a duration: write e.g. "90m", "6h", "2d" or "1d12h"')
    seconds = sum(float(amount) * DURATION_UNITS[unit] for amount, unit in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


class RunConfig(BaseModel):
    """`[run]`: where the ledger lives and how the work is cut. Run-time knobs, not identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state: str = ".reindex/state.db"  # a SQLite path, or a postgresql:// URL shared across machines
    state_env: str | None = None  # the ledger location from this environment variable (a URL with a password)
    shard_size: int = Field(1000, ge=1, le=1_000_000)
    batch_tokens: int | None = Field(None, ge=1)  # padded tokens per model call; None: the embedder's choice
    max_batch: int = Field(256, ge=1)
    too_long: Literal["truncate", "dead-letter"] = "truncate"
    sort_window: int = Field(1024, ge=1)  # documents sorted by length together, across shard boundaries
    queue_depth: int = Field(2, ge=1, le=64)  # shards buffered between stages: the memory bound
    max_cost_usd: float | None = Field(None, ge=0)  # stop (exit 75, resumable) before spending more
    deadline: str | None = None  # "6h", "2d": `plan` picks the cheapest route that finishes within it
    max_open_jobs: int = Field(8, ge=1)  # provider batch jobs in flight at once (deferred embedders)
    poll_seconds: float = Field(5.0, gt=0)  # first poll interval for provider jobs; doubles while idle
    poll_max_seconds: float = Field(60.0, gt=0)
    provider_attempts: int = Field(3, ge=1)  # submissions of a line before it becomes a dead letter
    # Dead letters verify accepts: a count (an integer) or a fraction of the source's documents (a float
    # below 1). Beyond it the target is not complete and cutover refuses without --force.
    max_dead_letters: StrictInt | StrictFloat = Field(0.01, ge=0)
    engine: Literal["local", "ray"] = "local"  # "ray": shards spread over a Ray cluster ([ray] section)
    # worker processes of the local engine (reindex.run.processes); None: one per core; 1: one process
    workers: int | None = Field(None, ge=1)
    # how far a repeated text is embedded once (reindex.run.claims): "run", across the whole run (a ledger
    # row per text; exactly-once billing); "window", the texts in flight and lately recorded (no row per
    # text: a flat cost per document); "auto", "run" for a paid embedder, else "window"
    dedupe: Literal["auto", "run", "window"] = "auto"

    @model_validator(mode="after")
    def _fraction_or_count(self) -> RunConfig:
        if isinstance(self.max_dead_letters, float) and self.max_dead_letters > 1:
            raise ValueError("max_dead_letters: a fraction is at most 1.0; write a count as an integer")
        return self

    @field_validator("deadline")
    @classmethod
    def _a_duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration_seconds(value)
        return value

    @property
    def deadline_seconds(self) -> float | None:
        return None if self.deadline is None else duration_seconds(self.deadline)

    def ledger_location(self) -> str:
        """Where the ledger lives: `state`, or the environment variable `state_env` names."""
        if self.state_env is None:
            return self.state
        value = environment(self.state_env, "[run] state_env")
        if not value:
            raise ConfigError(
                f"[run] state_env names {self.state_env!r}, which is not set",
                hint=f"export {self.state_env}=<sqlite path or postgresql:// URL>",
            )
        return value

    def ledger_on_postgres(self) -> bool:
        """Whether the ledger is a Postgres database (a postgresql:// URL) rather than a SQLite file."""
        return self.ledger_location().startswith(("postgres://", "postgresql://"))

    def dead_letter_ceiling(self, documents: int) -> int:
        """The most dead letters a complete target may have for a source of `documents`."""
        if isinstance(self.max_dead_letters, int):
            return self.max_dead_letters
        return int(self.max_dead_letters * documents)


class RayConfig(BaseModel):
    """`[ray]`: how the `ray` engine uses a cluster. Run-time knobs, not identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str | None = None  # "auto", "ray://head:10001", ...; omitted: a local Ray for this run only
    # embedding actors (one model each); None: as many as the cluster has GPUs (CPUs on a CPU cluster) for
    # them when the run starts (fixed for the run: reindex.run.ray.sizing); a number pins the pool
    actors: int | None = Field(None, ge=1)
    cpus_per_actor: float = Field(1.0, ge=0)
    gpus_per_actor: float = Field(0.0, ge=0)  # 1 on CUDA machines: one GPU per actor
    cpus_per_task: float = Field(1.0, gt=0)  # each read task
    # shards each actor holds at once: one embeds while another writes and records (one model call at a time)
    shards_per_actor: int = Field(2, ge=1, le=8)
    namespace: str | None = None
    runtime_env: dict[str, Any] = Field(default_factory=dict)  # passed to ray.init as given
    num_cpus: int | None = Field(None, ge=1)  # local Ray only: CPUs it may use (default: all)
    # the run ends resumably (exit 75) when no shard comes back for this long: an actor stalled, or one
    # that keeps dying and being restarted (reindex.run.ray.driver); longer than the slowest shard
    stall_seconds: float = Field(600.0, gt=0)


class CompareConfig(BaseModel):
    """`[compare]`: how `reindex compare` measures the new target against the live index."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(10, ge=1, le=1000)  # neighbours compared per query
    sample: int = Field(200, ge=1, le=100_000)  # documents used as queries, chosen by a hash of their id
    examples: int = Field(5, ge=0, le=100)  # most changed neighbourhoods shown
    seed: str = ""  # another seed picks another deterministic sample
    queries: Path | None = None  # BEIR queries.jsonl ({"_id", "text"}); with qrels: judged metrics
    qrels: Path | None = None  # BEIR qrels (query-id, corpus-id, score; tab-separated, header line)
    embedder: dict[str, Any] | None = None  # the live index's model (an [embedder] table): judged live too

    @model_validator(mode="after")
    def _queries_with_qrels(self) -> CompareConfig:
        if (self.queries is None) != (self.qrels is None):
            raise ValueError("queries and qrels go together (the BEIR layout)")
        return self


class GateConfig(BaseModel):
    """`[gate]`: thresholds the new target must meet before `cutover` flips the alias (else exit 3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_overlap_at_k: float | None = Field(None, ge=0, le=1)  # neighbourhoods kept, live vs new
    min_rbo: float | None = Field(None, ge=0, le=1)
    min_ann_recall: float | None = Field(None, ge=0, le=1)  # the target's ANN index vs exact neighbours
    min_ndcg_at_10: float | None = Field(None, ge=0, le=1)  # judged queries on the new target
    min_recall_at_k: float | None = Field(None, ge=0, le=1)
    max_ndcg_drop: float | None = Field(None, ge=0, le=1)  # live nDCG@10 minus new (needs [compare] embedder)

    @property
    def thresholds(self) -> dict[str, float]:
        return {name: value for name, value in self.model_dump().items() if value is not None}


class RouteConfig(BaseModel):
    """One `[[routes]]` table: another way to embed this corpus that `plan` prices beside the [embedder]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    embedder: dict[str, Any] | None = None  # an [embedder] table; omitted: the configured [embedder]
    gpu_hour_usd: float | None = Field(None, ge=0)  # self-hosted: what one GPU (or machine) hour costs
    gpus: int = Field(1, ge=1)  # self-hosted: GPUs (or machines) working at once
    docs_per_second: float | None = Field(None, gt=0)  # self-hosted, per GPU: measured (gpu-check, bench)
    completion_window_hours: float | None = Field(None, gt=0)  # a batch tier's window; default the provider's
    # the route's fingerprint as `reindex plan` prints it where its embedder loads (a GPU-only precision, vLLM,
    # a provider key not set here): used only when the embedder cannot be built on this machine
    fingerprint: str | None = Field(None, pattern=r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class Config:
    """A migration's file, validated once: each adapter's table into its kind's own `Config` (a `Section`;
    the target's a `TargetSection`), which the core reads and the registry builds from."""

    path: Path
    source: Section
    embedder: Section
    target: TargetSection
    run: RunConfig
    ray: RayConfig = field(default_factory=RayConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    routes: tuple[RouteConfig, ...] = ()
    # the [source], [embedder] and [target] tables as written (paths anchored): what the run's key digests,
    # so a ledger written before finds its run, and what `plan` prices routes against
    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def alias(self) -> str:
        return self.target.alias


def load(path: Path) -> Config:
    """Parse and validate `path`; every problem is a ConfigError naming the section and key."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found", hint="pass -c <path to a .toml>") from None
    return parse(text, path)


def parse(text: str, path: Path) -> Config:
    """Validate a config's text as `load` does (`path` names it in messages), e.g. before writing it.

    Relative paths in it are the config file's, not the working directory's: a command run from cron, CI
    or another folder reads the same corpus, model and ledger as one run beside the file (`anchor`)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    raw = anchor(raw, path.absolute().parent)
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown section [{unknown[0]}]", hint=f"sections are {', '.join(SECTIONS)}"
        )
    for section in ("source", "embedder", "target"):
        if not isinstance(raw.get(section), dict):
            raise ConfigError(f"{path}: missing section [{section}]", hint="see configs/ for examples")
    config = Config(
        path,
        validated_section("source", raw["source"]),
        validated_section("embedder", raw["embedder"]),
        validated_target(raw["target"]),
        validate("run", RunConfig, raw.get("run", {})),
        validate("ray", RayConfig, raw.get("ray", {})),
        validate("compare", CompareConfig, raw.get("compare", {})),
        validate("gate", GateConfig, raw.get("gate", {})),
        _routes(raw.get("routes", [])),
        {role: raw[role] for role in ("source", "embedder", "target")},
    )
    return config


def anchor(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """`raw` with every relative path made one under `base` (the config file's folder): [run] state (a
    SQLite file), [compare] queries and qrels, and in each adapter's table the fields its Config declares
    in `PATHS` (always a path) and `MODEL_PATHS` (a model folder or a hub id: anchored where `base` holds
    that folder, or where it is written as a path, "./x" or "../x")."""
    raw = {key: dict(value) if isinstance(value, dict) else value for key, value in raw.items()}
    run, compare = raw.get("run"), raw.get("compare")
    if isinstance(run, dict) and isinstance(run.get("state"), str) and "://" not in run["state"]:
        run["state"] = _under(base, run["state"])
    if isinstance(compare, dict):
        for key in ("queries", "qrels"):
            if isinstance(compare.get(key), str):
                compare[key] = _under(base, compare[key])
        if isinstance(compare.get("embedder"), dict):
            compare["embedder"] = _anchor_section("embedder", compare["embedder"], base)
    for role in ("source", "embedder", "target"):
        if isinstance(raw.get(role), dict):
            raw[role] = _anchor_section(role, raw[role], base)
    if isinstance(raw.get("routes"), list):
        raw["routes"] = [
            {**route, "embedder": _anchor_section("embedder", route["embedder"], base)}
            if isinstance(route, dict) and isinstance(route.get("embedder"), dict)
            else route
            for route in raw["routes"]
        ]
    return raw


def _anchor_section(role: str, section: dict[str, Any], base: Path) -> dict[str, Any]:
    try:
        model = registry.resolve(role, str(section.get("kind", "")))  # type: ignore[arg-type]
    except ConfigError:
        return section  # an unknown kind: `check` names it
    section = dict(section)
    paths = model.Config.PATHS if isinstance(model.Config, NamesPaths) else ()
    for key in paths:
        if isinstance(section.get(key), str) and not section[key].startswith(":"):  # ":memory:"
            section[key] = _under(base, section[key])
    models = model.Config.MODEL_PATHS if isinstance(model.Config, NamesModelPaths) else ()
    for key in models:
        value = section.get(key)
        if isinstance(value, str) and _is_local(value, base):
            section[key] = _under(base, value)
    return section


def _under(base: Path, value: str) -> str:
    """`value` under `base` unless absolute; "../x" is resolved in the text (the config's folder may not be
    there yet when `init` checks what it writes)."""
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else base / path)


def _is_local(value: str, base: Path) -> bool:
    """A model named by a path rather than a hub id: written as one, or a folder beside the config."""
    return value.startswith(("./", "../", "~", "/")) or (base / value).exists()


def _routes(raw: Any) -> tuple[RouteConfig, ...]:
    """`[[routes]]`: each validated, names unique, each route's embedder table checked like [embedder]."""
    if not isinstance(raw, list):
        raise ConfigError("[routes] must be an array of tables", hint="write each route as [[routes]]")
    routes = tuple(validate(f"routes.{i}", RouteConfig, table) for i, table in enumerate(raw))
    names = [route.name for route in routes]
    if duplicate := next((name for name in names if names.count(name) > 1), None):
        raise ConfigError(f"[[routes]] name {duplicate!r} is used twice", hint="give each route its own name")
    for route in routes:
        if route.embedder is not None:
            adapter = registry.resolve("embedder", str(route.embedder.get("kind", "")))
            validate(f"routes.{route.name}.embedder", adapter.Config, route.embedder)
    return routes


def validated_section(role: Role, table: Mapping[str, Any]) -> Section:
    """`table` validated into its kind's own `Config`, without connecting to anything."""
    adapter = registry.resolve(role, str(table.get("kind", "")))
    validated = validate(role, adapter.Config, dict(table))
    if not isinstance(validated, Section):
        base = "TargetSection" if role == "target" else "Section"
        raise ConfigError(
            f"the {role} kind {table.get('kind')!r} declares a Config the core cannot read",
            hint=f"its adapter's Config must extend reindex.ports.{base}",
        )
    return validated


def validated_target(table: Mapping[str, Any]) -> TargetSection:
    if not table.get("alias"):
        raise ConfigError("[target] missing required key 'alias'", hint="the name applications read")
    validated = validated_section("target", table)
    if not isinstance(validated, TargetSection):
        raise ConfigError(
            f"the target kind {table.get('kind')!r} declares a Config without an alias",
            hint="its adapter's Config must extend reindex.ports.TargetSection",
        )
    return validated
