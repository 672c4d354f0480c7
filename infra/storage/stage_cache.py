"""Reuse of a CPU stage's output when its input fingerprint is unchanged.

A cache entry ``cache/<stage>/<fingerprint>.json`` holds the stage's result and, for every
dataset the result points at, the data folder that was published. A hit is accepted only when
each of those datasets still publishes that very folder (nothing replaced it since), so the new
run's stage manifest can point at the same URIs.
"""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from pydantic import BaseModel

from infra.layout import cache_key
from infra.storage.datasets import find_dataset
from infra.storage.store import ObjectStore

log = logging.getLogger(__name__)
R = TypeVar("R", bound=BaseModel)


class CacheEntry(BaseModel):
    """What a finished stage recorded for its fingerprint."""

    stage: str
    fingerprint: str
    run_id: str
    result: dict
    outputs: dict[str, str]


def load_cached(store: ObjectStore, stage: str, fingerprint: str, model: type[R]) -> R | None:
    """The cached result with ``report.cached`` set, or None (no entry, or its outputs moved on)."""
    started = time.perf_counter()
    try:
        entry = CacheEntry.model_validate_json(store.get_bytes(cache_key(stage, fingerprint)))
    except FileNotFoundError:
        return None
    for prefix, data_prefix in entry.outputs.items():
        current = find_dataset(store, prefix)
        if current is None or current.data_prefix != data_prefix:
            log.info("%s: cached output %s was replaced since; recomputing", stage, prefix)
            return None
    result = model.model_validate(entry.result)
    report = result.report.model_copy(  # type: ignore[attr-defined]
        update={"cached": True, "seconds": time.perf_counter() - started}
    )
    log.info(
        "%s: inputs unchanged (fingerprint %s): reusing the output of run %s",
        stage,
        fingerprint[:12],
        entry.run_id,
    )
    return result.model_copy(update={"report": report})


def save_cached(
    store: ObjectStore,
    stage: str,
    fingerprint: str,
    run_id: str,
    result: BaseModel,
    output_prefixes: list[str],
) -> None:
    """Record ``result`` for ``fingerprint`` with the data folders its datasets publish now."""
    outputs = {}
    for prefix in output_prefixes:
        manifest = find_dataset(store, prefix)
        if manifest is None:
            return  # nothing published to point at: do not cache
        outputs[prefix] = manifest.data_prefix
    entry = CacheEntry(
        stage=stage,
        fingerprint=fingerprint,
        run_id=run_id,
        result=result.model_dump(mode="json"),
        outputs=outputs,
    )
    store.put_bytes(cache_key(stage, fingerprint), entry.model_dump_json(indent=2).encode())
