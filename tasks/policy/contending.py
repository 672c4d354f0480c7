"""How a training run's contenders contend: each model family fitted on the run's snapshot
(resuming its training id's newest checkpoint, or reusing the version an earlier run registered
for it), calibrated and backtested (:func:`contend`), and what a contender unit publishes for the
train stage to read back (:class:`ContenderResult`, :func:`kept_for_the_run`,
:func:`published_contender`).

Both the train stage (families it fits in its own process) and the contender unit
(:mod:`tasks.stages.contenders`, one flow run per family) use it, so neither runner imports the
other. A unit's result travels through the store, never in memory: its manifest
``runs/<run_id>/contender-<family>.json`` (written last) and its bundle under
``runs/<run_id>/contenders/<family>/``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import BaseModel, Field

from infra.compute.devices import Device, available_cores, gpu_driver_present
from infra.errors import HybridflowInputError
from infra.layout import contender_bundle_key, stage_manifest_key, version_manifest_key
from infra.routing.accounting import embedded_pool
from infra.settings import HybridflowSettings
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest, release_local_dir
from infra.storage.registry import AliasRecord, ModelManifest, ModelRegistry, new_version_id
from infra.storage.store import ObjectStore, sha256_bytes
from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ml.ddp import DistContext
from tasks.ml.epoch_record import EpochRecord
from tasks.ml.models import FamilySpec, FitJob, FitOutcome, get_family
from tasks.ml.models.base import PARALLEL_FIT_ROWS
from tasks.ml.normalizer import Normalizer
from tasks.ml.quality import judge_candidate
from tasks.ml.snapshot_reader import SnapshotStream
from tasks.ml.warm_start import CODE_VERSION, StartPoint, choose_start, training_id
from tasks.reporting.records import (
    FeaturesResult,
    PreprocessResult,
    StageReport,
    contender_stage,
)

log = logging.getLogger(__name__)


class TrainingOptions(BaseModel):
    """Per-run switches of the train stage and its contenders."""

    fresh: bool = False
    scratch: bool = False
    stop_after_steps: int | None = None
    families: list[str] | None = None  # None: HYBRIDFLOW_TRAIN__FAMILIES
    pool: str = ""  # the work pool running the stage ("": this machine's, by its device)
    scoring_features: str | None = None  # the run's scoring features, recorded in each version

    def of_run(self, features: FeaturesResult) -> TrainingOptions:
        """These options for the run whose features stage gave ``features``: its versions
        record its scoring features (what the endpoint serves with them)."""
        return self.model_copy(update={"scoring_features": features.scoring_prefix})


class TrainingInterrupted(RuntimeError):
    """Training stopped early on purpose (``stop_after_steps``) with a checkpoint to resume from."""


@dataclass
class Contender:
    """A contender: its version's manifest (registered by an earlier run, or to be registered
    with the leaderboard once every contender is judged) and what this run did to get it."""

    manifest: ModelManifest
    history: list[EpochRecord]
    reused: bool
    checkpoints_uri: str
    files: dict[str, bytes] | None = None  # the bundle of a version not registered yet
    start: str = ""  # where this run's fit started (warm start from production, or why not)


class ContenderResult(BaseModel):
    """What a contender unit publishes: its report, its (not yet registered) version's manifest
    and where its bundle waits in the store."""

    report: StageReport
    family: str
    manifest: ModelManifest
    bundle: dict[str, str] = Field(
        default_factory=dict,
        description="file name -> store key (empty: a version an earlier run registered)",
    )
    history: list[EpochRecord] = Field(default_factory=list)
    reused: bool = False
    checkpoints_uri: str = ""
    start: str = ""


@dataclass
class OpenedSnapshot:
    """The run's training snapshot, read locally, and what every contender shares of it."""

    data: SnapshotStream
    normalizer: Normalizer
    fingerprint: str
    registry: ModelRegistry
    production: AliasRecord | None


@contextmanager
def opened_snapshot(
    store: ObjectStore, prepared: PreprocessResult, settings: HybridflowSettings
) -> Iterator[OpenedSnapshot]:
    """The snapshot of ``prepared`` as a stream (its local copy released afterwards)."""
    snapshot = read_dataset_manifest(store, prepared.snapshot_prefix)
    normalizer = Normalizer.model_validate(snapshot.metadata["normalizer"])
    local = local_dataset_dir(store, snapshot)
    try:
        data = SnapshotStream(
            local,
            normalizer.features,
            chunk_rows=settings.train.stream_chunk_rows,
            cache_bytes=settings.train.stream_cache_mb << 20,
        )
        registry = ModelRegistry(store)
        yield OpenedSnapshot(data, normalizer, data.fingerprint(), registry, registry.alias())
    finally:
        release_local_dir(store, local)


def contenders_at_once(
    settings: HybridflowSettings,
    training_rows: int,
    devices: dict[str, str],
    cores: int | None = None,
) -> int:
    """How many of a run's contenders (``devices``: family -> its device preference) an
    embedded run fits at the same time, each on a thread of its own: ``contenders_at_once``
    when set, else one per core when every fit is one-threaded (on the CPU, under
    :data:`PARALLEL_FIT_ROWS` training rows, ``threads`` 0 or 1, no DDP) and at most one is a
    network (a network fit seeds and draws from torch's global generator: two side by side
    would draw from each other's), else one. On a 2-core box the fits of a 431k-event run
    (12.5k training rows) left the second core idle: four one-threaded fits one after another."""
    train = settings.train
    if train.contenders_at_once:
        return max(1, min(train.contenders_at_once, len(devices)))
    on_cpu = all(d == "cpu" or (d == "auto" and not gpu_driver_present()) for d in devices.values())
    one_thread = training_rows < PARALLEL_FIT_ROWS and train.threads <= 1
    networks = sum(map(_is_network, devices))
    if not (on_cpu and one_thread and train.ddp_processes <= 1 and networks <= 1):
        return 1
    return max(1, min(cores or available_cores(), len(devices)))


def longest_first(families: list[str]) -> list[str]:
    """The order to start contenders fitted at the same time in: a network first (it fits for
    epochs: at 4.26M events the mlp took 22 s against gbm's 12, logistic's 4 and rfm's 4), the
    others as given, so that the long fit does not start last on a free core."""
    return sorted(families, key=lambda f: not _is_network(f))


def _is_network(family: str) -> bool:
    """Whether ``family`` fits a network (epochs, torch's global generator)."""
    from tasks.ml.models.network import NetworkFamily

    return isinstance(get_family(family), NetworkFamily)


MIN_EXAMPLES_PER_CLASS = 5  # in every split: what fitting, calibrating and judging need


def check_trainable(data: SnapshotStream, as_of: dt.date, horizon_days: int) -> None:
    """HybridflowInputError naming the cause and the fix when no family could produce a model
    from the snapshot: no examples, one class only, or too few of a class in a split."""
    window = f"({as_of - dt.timedelta(days=horizon_days)}, {as_of}]"
    counts = data.label_counts()
    rows = sum(n for n, _ in counts.values())
    positives = sum(p for _, p in counts.values())
    fix = (
        "fix: give more history (events before the window), or choose --as-of / "
        "--horizon-days so that some, but not all, customers buy in the window"
    )
    if rows == 0:
        raise HybridflowInputError(
            f"no training examples: no customer has events before the label window {window}; {fix}"
        )
    if positives in (0, rows):
        who = "no customer" if positives == 0 else "every customer"
        raise HybridflowInputError(
            f"all {rows} training examples have one class: {who} bought in the label window "
            f"{window}, and no model can learn from one class; {fix}"
        )
    short = [
        f"{split} {n} rows, {p} buying"
        for split, (n, p) in counts.items()
        if min(p, n - p) < MIN_EXAMPLES_PER_CLASS
    ]
    if short:
        raise HybridflowInputError(
            f"too few training examples to fit and judge a model ({'; '.join(short)}; every "
            f"split needs at least {MIN_EXAMPLES_PER_CLASS} customers who bought in {window} and "
            f"{MIN_EXAMPLES_PER_CLASS} who did not): more customers are needed; {fix}"
        )


def contend(
    store: ObjectStore,
    opened: OpenedSnapshot,
    prepared: PreprocessResult,
    spec: FamilySpec,
    settings: HybridflowSettings,
    options: TrainingOptions,
    ctx: DistContext,
    device: Device,
    as_of: dt.date,
    horizon_days: int,
) -> Contender | None:
    """One family: the version an earlier run registered for this training id, else a fit
    (from its newest valid checkpoint, or production when it warm-starts), its judgement and
    its manifest (registered later, with the leaderboard). None on ranks other than 0."""
    registry, production, data = opened.registry, opened.production, opened.data
    start = choose_start(
        registry, production, opened.normalizer, spec, settings.train, options.scratch
    )
    tid = training_id(opened.fingerprint, spec, settings.train, start)
    checkpoints = CheckpointStore(store, tid, keep=settings.checkpoint.keep)
    done = None if options.fresh else registry.find_training(tid)
    if done is not None:
        log.info(
            "%s: training %s finished before as version %s: reusing it (--fresh refits)",
            spec.kind,
            tid,
            done.version,
        )
        start_reason = f"{start.reason} (the same fit as version {done.version}, reused)"
        return (
            Contender(done, [], True, checkpoints.uri(), start=start_reason)
            if ctx.is_main
            else None
        )
    log.info(
        "%s: training %s: %s; checkpoints at %s", spec.kind, tid, start.reason, checkpoints.uri()
    )
    if options.fresh and ctx.is_main:
        removed = checkpoints.clear()
        log.info("--fresh: training %s starts over (%d checkpoints removed)", tid, removed)
    ctx.barrier()
    outcome = get_family(spec.kind).fit(
        spec,
        FitJob(
            data=data,
            normalizer=opened.normalizer,
            settings=settings.train,
            device=device,
            ctx=ctx,
            start=start.model,
            checkpoints=checkpoints,
            checkpoint_policy=CheckpointPolicy.of(settings.checkpoint),
            stop_after_steps=options.stop_after_steps,
        ),
    )
    if outcome.interrupted:
        raise TrainingInterrupted(
            f"training {tid} ({spec.kind}) stopped after {options.stop_after_steps} steps at "
            f"step {outcome.record.get('steps')}; run again to resume from its checkpoint"
        )
    if not ctx.is_main:
        return None
    judged = time.perf_counter()
    model, evaluation = judge_candidate(
        store, prepared, outcome.model, spec, data, settings, device, as_of, horizon_days
    )
    files = model.bundle_files()
    manifest = ModelManifest(
        version=new_version_id(),
        created_at=dt.datetime.now(dt.UTC),
        files={name: sha256_bytes(body) for name, body in files.items()},
        kind=spec.kind,
        metrics=evaluation.flat_metrics()
        | {
            "n_train": float(data.rows("train")),
            "n_test": float(data.newest_origin().rows("test")),
        },
        evaluation=evaluation.model_dump(mode="json"),
        features=model.features,
        data_fingerprint=opened.fingerprint,
        parent_version=start.parent_version,
        warm_start=start.warm_start,
        training_id=tid,
        code_version=CODE_VERSION,
        as_of=as_of,
        horizon_days=horizon_days,
        scoring_features=options.scoring_features,
        snapshot=prepared.snapshot_prefix,
        training=training_record(
            outcome, start, production, spec, model.describe(), model.n_parameters, settings
        )
        | {
            "device": outcome.record.get("device", device.type),
            "pool": options.pool or embedded_pool(device.type),
            "judge_seconds": time.perf_counter() - judged,
            "origins": [o.isoformat() for o in data.origins()],
        },
    )
    log.info("%s: judged (%s)", spec.kind, model.describe())
    return Contender(manifest, outcome.history, False, checkpoints.uri(), files, start.reason)


def training_record(
    outcome: FitOutcome,
    start: StartPoint,
    production: AliasRecord | None,
    spec: FamilySpec,
    description: str,
    parameters: int,
    settings: HybridflowSettings,
) -> dict:
    """What the version's manifest says about how it was fitted."""
    return outcome.record | {
        "family": spec.kind,
        "spec": spec.model_dump(mode="json"),
        "parameters": parameters,
        "description": description,
        "fit_seconds": outcome.seconds,
        "start": start.reason,
        "production_before": production.version if production else None,
        "settings": settings.train.model_dump(mode="json"),
    }


def kept_for_the_run(
    store: ObjectStore, run_id: str, contender: Contender, report: StageReport
) -> ContenderResult:
    """The contender's bundle put in the store for run ``run_id`` (its manifest is written by
    the caller, last), as the result the train stage reads back."""
    bundle: dict[str, str] = {}
    for name, body in (contender.files or {}).items():
        key = contender_bundle_key(run_id, contender.manifest.kind, name)
        store.put_bytes(key, body)
        bundle[name] = key
    return ContenderResult(
        report=report,
        family=contender.manifest.kind,
        manifest=contender.manifest,
        bundle=bundle,
        history=contender.history,
        reused=contender.reused,
        checkpoints_uri=contender.checkpoints_uri,
        start=contender.start,
    )


def published_contender(store: ObjectStore, run_id: str, family: str) -> Contender | None:
    """The contender a unit of run ``run_id`` published for ``family`` (its bundle read back,
    checked against the manifest's sha256; its registered version when an earlier attempt of
    the train stage registered it), None when no unit did."""
    key = stage_manifest_key(run_id, contender_stage(family))
    if not store.exists(key):
        return None
    result = ContenderResult.model_validate_json(store.get_bytes(key))
    registry = ModelRegistry(store)
    if result.bundle and store.exists(version_manifest_key(result.manifest.version)):
        # an earlier attempt of the train stage registered it before it stopped
        result = result.model_copy(
            update={"manifest": registry.get(result.manifest.version), "bundle": {}}
        )
    files = {name: store.get_bytes(k) for name, k in result.bundle.items()} or None
    if files is not None:
        for name, body in files.items():
            if sha256_bytes(body) != result.manifest.files.get(name):
                raise ValueError(f"contender {family} of run {run_id}: {name} does not match")
    log.info("%s: fitted by its own unit of run %s (pool %s)", family, run_id, result.report.pool)
    return Contender(
        result.manifest,
        result.history,
        result.reused,
        result.checkpoints_uri,
        files,
        result.start,
    )
