"""What a target collection is created with: the re-embedded vector at the new size, every other named vector
(dense or sparse) with the source's own params, and the index, quantization, on-disk and sharding settings,
each from `[target]` where set there, else copied from the source collection.

The decision to copy: a target is a drop-in replacement, so unless told otherwise it is configured like the
collection it replaces (a quantized source stays quantized, its HNSW settings stay). `[target]` settings
apply to the re-embedded vector (per-vector params) and to the collection's shards and replicas; carried
vectors keep their params exactly. `quantization = { type = "none" }` turns quantization off for the new
vector; a source's collection-wide quantization then moves onto each carried dense vector that had none of
its own, so they keep it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reindex.errors import ConfigError
from reindex.ports import Distance, Loss
from reindex_adapters.qdrant.points import qdrant_distance

if TYPE_CHECKING:
    from qdrant_client import models

# settings a collection holds as a whole, copied from the source unless [target] sets them
_COLLECTION_KEYS = (
    "on_disk_payload",
    "shard_number",
    "sharding_method",
    "replication_factor",
    "write_consistency_factor",
    "payload",  # payload storage: its memory placement
)
# the collection's own configs, copied from the source: (as CollectionConfig reports it, create's argument)
_CONFIGS = (
    ("strict_mode_config", "strict_mode_config"),
    ("optimizer_config", "optimizers_config"),
    ("wal_config", "wal_config"),
)
# what of the old vector's own params the new vector keeps: not its size or multivector layout; its datatype
# where the new model's float vectors can be stored in it (all but uint8: `losses`)
_KEPT_VECTOR_KEYS = ("on_disk", "memory", "datatype", "hnsw_config", "quantization_config")
_FLOAT_DATATYPES = ("float32", "float16", "turbo4", "turbo8", "turbo16")
# what `[target] accept` may name: what the new collection cannot keep of the source's
Kept = Literal["vector_datatype", "shard_keys"]
_LOSSES: dict[str, str] = {
    "vector_datatype": "the re-embedded vector's datatype holds integers (uint8); the new model's vectors are"
    " floats, stored as float32",
    "shard_keys": "custom sharding: the new collection is sharded automatically (its points carry no shard"
    " key, and the source's shard keys are not read)",
}
# payload indexes on fields the tool writes: finalize makes its own
_OWN_FIELDS = ("reindex_id", "reindex_content_hash", "reindex_fingerprint")
LOCAL_NOTE = (
    "local mode keeps these settings in the collection's config but searches by brute force and has one"
    " shard: quantization, HNSW, on_disk, shard_number and replication_factor take effect on a server"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScalarQuantization(_Strict):
    type: Literal["scalar"]
    quantile: float | None = Field(None, ge=0.5, le=1.0)  # Qdrant's range; its default is 0.99 and up
    always_ram: bool | None = None


class BinaryQuantization(_Strict):
    type: Literal["binary"]
    always_ram: bool | None = None


class ProductQuantization(_Strict):
    type: Literal["product"]
    compression: Literal["x4", "x8", "x16", "x32", "x64"] = "x16"
    always_ram: bool | None = None


class NoQuantization(_Strict):
    type: Literal["none"]


Quantization = Annotated[
    ScalarQuantization | BinaryQuantization | ProductQuantization | NoQuantization,
    Field(discriminator="type"),
]


class Hnsw(_Strict):
    m: int | None = Field(None, ge=0)  # 0: no graph (exact search only)
    ef_construct: int | None = Field(None, ge=4)


class TargetOptions(BaseModel):
    """`[target]` settings of a new collection; unset ones are copied from the source (module docstring)."""

    on_disk: bool | None = None  # the new vectors in memmapped storage instead of RAM
    hnsw: Hnsw | None = None
    quantization: Quantization | None = None
    shard_number: int | None = Field(None, ge=1)  # server only
    replication_factor: int | None = Field(None, ge=1)  # server only
    accept: list[Kept] = Field(default_factory=list)  # what the new collection may lose (`losses`)

    def chosen(self) -> dict[str, Any]:
        """The settings `[target]` sets, as JSON: recorded on the target, so a resumed run with others stops."""
        return self.model_dump(
            include={"on_disk", "hnsw", "quantization", "shard_number", "replication_factor"},
            exclude_none=True,
        )


def source_layout(
    config: models.CollectionConfig, chosen: str | None, payload_schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The source collection's layout as JSON (`SourceSchema.layout`): the old vector's params, the other
    named vectors' (carried), its collection-wide settings and configs, its metadata (not the tool's), and
    its payload indexes (`get_collection().payload_schema`; local mode reports none)."""
    from reindex_adapters.qdrant.bookkeeping import META_KEY

    params = config.params
    vectors = params.vectors
    named = dict(vectors) if isinstance(vectors, Mapping) else {}
    old = named.get(chosen or "") if named else vectors
    collection = {
        key: _json(getattr(params, key)) for key in _COLLECTION_KEYS if getattr(params, key) is not None
    }
    if config.hnsw_config is not None:
        collection["hnsw_config"] = _json(config.hnsw_config)
    if config.quantization_config is not None:
        collection["quantization_config"] = _json(config.quantization_config)
    for reported, _ in _CONFIGS:
        if getattr(config, reported, None) is not None:
            collection[reported] = _json(getattr(config, reported))
    metadata = {k: v for k, v in (config.metadata or {}).items() if k != META_KEY}
    indexes = {
        field: _json(info) for field, info in (payload_schema or {}).items() if field not in _OWN_FIELDS
    }
    return {
        "vector": None if old is None else _json(old),
        "dense": {name: _json(p) for name, p in named.items() if name != chosen},
        "sparse": {name: _json(p) for name, p in (params.sparse_vectors or {}).items()},
        "collection": collection,
        "metadata": metadata,
        "payload_schema": indexes,
    }


def losses(layout: Mapping[str, Any], name: str | None, accepted: Sequence[str]) -> list[Loss]:
    """What the new collection cannot keep of the source's (`[target] accept` names the ones given up)."""
    found: dict[str, tuple[str, ...]] = {}
    if (layout.get("vector") or {}).get("datatype") == "uint8":
        found["vector_datatype"] = (name or "(the collection's one vector)",)
    if layout.get("collection", {}).get("sharding_method") == "custom":
        found["shard_keys"] = ("sharding_method custom",)
    return [Loss(key, _LOSSES[key], objects, key in accepted) for key, objects in sorted(found.items())]


def local_payload_schema(client: Any, collection: str) -> dict[str, Any]:
    """Local mode reports no payload indexes (its `payload_schema` is always empty), yet keeps and uses one
    kind: a text index with `scoring`, which its BM25 text queries need (`text_indexes` of its collection,
    qdrant_client/local/local_collection.py). Read those, as a server would report them, so a target keeps
    what the application's text queries need; {} where the client holds no such collection."""
    local = getattr(client, "_client", None)
    collections = getattr(local, "collections", None)
    if not isinstance(collections, Mapping):
        return {}
    aliases = getattr(local, "aliases", None) or {}
    found = collections.get(aliases.get(collection, collection))
    indexes = getattr(found, "text_indexes", None) or {}
    return {field: {"data_type": "text", "params": _json(params)} for field, params in indexes.items()}


def refuse_unaccepted(found: Sequence[Loss], source: str) -> None:
    """A ConfigError naming what `[target] accept` must name before the new collection is created."""
    refused = [loss.key for loss in found if not loss.accepted]
    if refused:
        keys = ", ".join(f'"{key}"' for key in refused)
        raise ConfigError(
            f"the new collection would not keep what {source!r} has: {', '.join(refused)}"
            " (`reindex plan` lists each)",
            hint=f"to go ahead anyway, losing them, set [target] accept = [{keys}]",
        )


def payload_indexes(layout: Mapping[str, Any]) -> dict[str, Any]:
    """The source's payload indexes as `create_payload_index` takes them: the parameters where the server
    reported them (tokenizer, `is_tenant`, `is_principal`, on-disk, ...), else the type."""
    from qdrant_client import models

    kinds: dict[str, Any] = {
        "keyword": models.KeywordIndexParams,
        "integer": models.IntegerIndexParams,
        "float": models.FloatIndexParams,
        "geo": models.GeoIndexParams,
        "text": models.TextIndexParams,
        "bool": models.BoolIndexParams,
        "datetime": models.DatetimeIndexParams,
        "uuid": models.UuidIndexParams,
    }
    made: dict[str, Any] = {}
    for field, info in sorted(layout.get("payload_schema", {}).items()):
        params = info.get("params")
        if isinstance(params, Mapping) and params.get("type") in kinds:
            made[field] = kinds[params["type"]].model_validate(params)
        else:
            made[field] = models.PayloadSchemaType(info["data_type"])
    return made


def carried_names(layout: Mapping[str, Any]) -> list[str]:
    return sorted([*layout.get("dense", {}), *layout.get("sparse", {})])


def creation(
    layout: Mapping[str, Any], name: str | None, dim: int, distance: Distance, options: TargetOptions
) -> dict[str, Any]:
    """The keyword arguments of `create_collection` for a target (see the module docstring)."""
    from qdrant_client import models

    collection = dict(layout.get("collection", {}))
    dense = {n: dict(p) for n, p in layout.get("dense", {}).items()}
    wide = collection.pop("quantization_config", None)
    if isinstance(options.quantization, NoQuantization) and wide is not None:
        for params in dense.values():  # kept on the carried vectors, off the new one
            params.setdefault("quantization_config", wide)
        wide = None
    new = models.VectorParams(size=dim, distance=qdrant_distance(distance), **_new_vector(layout, options))
    vectors = {n: models.VectorParams.model_validate(p) for n, p in dense.items()}
    sparse = {n: models.SparseVectorParams.model_validate(p) for n, p in layout.get("sparse", {}).items()}
    hnsw = collection.pop("hnsw_config", None)
    configs = {argument: collection.pop(reported, None) for reported, argument in _CONFIGS}
    if collection.get("sharding_method") == "custom":  # refused unless accepted (`losses`): auto sharding
        collection.pop("sharding_method")
    if "sharding_method" in collection:
        collection["sharding_method"] = models.ShardingMethod(collection["sharding_method"])
    if "payload" in collection:
        collection["payload"] = models.PayloadStorageParams.model_validate(collection["payload"])
    settings = collection | options.model_dump(
        include={"shard_number", "replication_factor"}, exclude_none=True
    )
    return {
        "vectors_config": new if name is None else {name: new, **vectors},
        "sparse_vectors_config": sparse or None,
        "hnsw_config": None if hnsw is None else models.HnswConfigDiff.model_validate(_diff(hnsw)),
        "quantization_config": None if wide is None else _quantization_of_json(wide),
        "strict_mode_config": _config_of(models.StrictModeConfig, configs["strict_mode_config"]),
        "optimizers_config": _config_of(models.OptimizersConfigDiff, configs["optimizers_config"]),
        "wal_config": _config_of(models.WalConfigDiff, configs["wal_config"]),
        **settings,
    }


def _config_of(model: type[BaseModel], value: Mapping[str, Any] | None) -> Any:
    """A reported config as the diff a new collection takes: the fields that model has, set."""
    if value is None:
        return None
    return model.model_validate({k: v for k, v in value.items() if k in model.model_fields and v is not None})


def _new_vector(layout: Mapping[str, Any], options: TargetOptions) -> dict[str, Any]:
    """The re-embedded vector's own params: the old vector's, overridden by [target]."""
    from qdrant_client import models

    old = layout.get("vector") or {}
    kept: dict[str, Any] = {key: old[key] for key in _KEPT_VECTOR_KEYS if old.get(key) is not None}
    if kept.get("datatype") not in (None, *_FLOAT_DATATYPES):
        kept.pop("datatype")  # uint8: the new model's floats are stored as float32 (a named loss)
    if options.on_disk is not None:
        kept["on_disk"] = options.on_disk
    if options.hnsw is not None:
        kept["hnsw_config"] = {
            **(kept.get("hnsw_config") or {}),
            **options.hnsw.model_dump(exclude_none=True),
        }
    if options.quantization is not None:
        kept.pop("quantization_config", None)
        chosen = quantization(options.quantization)
        if chosen is not None:
            kept["quantization_config"] = chosen
    if "hnsw_config" in kept:
        kept["hnsw_config"] = models.HnswConfigDiff.model_validate(_diff(kept["hnsw_config"]))
    if isinstance(kept.get("quantization_config"), Mapping):
        kept["quantization_config"] = _quantization_of_json(kept["quantization_config"])
    return kept


def quantization(chosen: Quantization) -> Any:
    """[target] quantization as Qdrant's model; None for "none"."""
    from qdrant_client import models

    if isinstance(chosen, ScalarQuantization):
        return models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(
                type=models.ScalarType.INT8, quantile=chosen.quantile, always_ram=chosen.always_ram
            )
        )
    if isinstance(chosen, BinaryQuantization):
        return models.BinaryQuantization(binary=models.BinaryQuantizationConfig(always_ram=chosen.always_ram))
    if isinstance(chosen, ProductQuantization):
        ratio = models.CompressionRatio(chosen.compression)
        return models.ProductQuantization(
            product=models.ProductQuantizationConfig(compression=ratio, always_ram=chosen.always_ram)
        )
    return None


def described(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """`creation`'s arguments as JSON, for `plan`."""
    return {key: _json(value) for key, value in arguments.items() if value is not None}


def in_words(params: Mapping[str, Any]) -> str:
    """A vector's params (as JSON) in a few words: `dense 384 cosine, on_disk`, `sparse, modifier idf`."""
    if "size" not in params:
        modifier = params.get("modifier")
        return "sparse" + (f", modifier {modifier}" if modifier else "")
    said = [f"dense {params['size']} {str(params.get('distance', '')).lower()}"]
    said += ["multivector"] if params.get("multivector_config") else []
    said += ["on_disk"] if params.get("on_disk") else []
    if params.get("hnsw_config"):
        said.append(f"hnsw {words(params['hnsw_config'])}")
    if params.get("quantization_config"):
        kind, settings = next(iter(params["quantization_config"].items()))
        said.append(f"quantization {kind} {words(settings)}".rstrip())
    return ", ".join(said)


def words(value: Any) -> str:
    """Settings as a reader writes them: `m 32, ef_construct 200`; booleans in TOML's spelling."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {words(v)}" for k, v in value.items())
    return str(value).lower() if isinstance(value, bool) else str(value)


def _quantization_of_json(value: Mapping[str, Any]) -> Any:
    from qdrant_client import models

    kinds: dict[str, type[BaseModel]] = {
        "scalar": models.ScalarQuantization,
        "binary": models.BinaryQuantization,
        "turbo": models.TurboQuantization,
    }
    kind = next(iter(value))
    return kinds.get(kind, models.ProductQuantization).model_validate(value)


def _diff(hnsw: Mapping[str, Any]) -> dict[str, Any]:
    """An HNSW config as the diff a new collection takes (a server reports the whole config)."""
    from qdrant_client import models

    return {k: v for k, v in hnsw.items() if k in models.HnswConfigDiff.model_fields and v is not None}


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    return value
