"""The store's layout: every key hybridflow reads or writes is formatted here and nowhere else.

::

    runs/<run_id>/<stage>.json                      a stage's manifest (written last), drift.json
    runs/<run_id>/{events,quarantine,training_examples}/   the run's datasets
    runs/<run_id>/backtest_examples/                features at T-2H, labels in (T-2H, T-H]
    runs/<run_id>/contenders/<family>/<file>        a contender's bundle until the run registers it
    features/as_of=YYYY-MM-DD/run=<run_id>/         a run's scoring features at T (scored; served
                                                    with the model that run trained)
    snapshots/as_of=YYYY-MM-DD_h<H>/run=<run_id>/   a run's training snapshot (split=train|val|test)
    snapshots/backtest/as_of=YYYY-MM-DD_h<H>/run=<run_id>/  the backtest's training snapshot
    predictions/as_of=YYYY-MM-DD/                   batch predictions
    models/versions/<version>/{model.json,model.pt,manifest.json}
    models/aliases/<alias>.json                     production and its history
    checkpoints/<training_id>/step-<n>/state.pt     + manifest-<n>.json beside it
    profiles/<stage>/<pool>/<time>-<id>.json        measured stage runs (routing)
    costs/<YYYY-MM-DD>/<run_id>.json                cost reports
    drift/references/<version>.json                 what drift compares with (bin edges, shares)
    drift/references/<version>/customers/           the customers a version was trained on
    cache/<stage>/<fingerprint>.json                reusable CPU stage outputs
    events-log/segments/<seq:012d>.parquet          accepted events, each segment written once
    events-log/readers/<reader>.json                how far a log reader got (e.g. the emitter)
    .staging/                                       a folder store's scratch space

A dataset at ``<prefix>`` is ``<prefix>/_manifest.json`` naming one ``<prefix>/data-<id>/``
(Spark's own part files, or ``[<column>=<value>/]part-<id>.parquet`` written by executors).
"""

from __future__ import annotations

import datetime as dt
import re
from urllib.parse import quote, unquote

from infra.errors import HybridflowInputError

RUNS = "runs"
FEATURES = "features"
SNAPSHOTS = "snapshots"
PREDICTIONS = "predictions"
VERSIONS = "models/versions"
ALIASES = "models/aliases"
CHECKPOINTS = "checkpoints"
PROFILES = "profiles"
COSTS = "costs"
DRIFT_REFERENCES = "drift/references"
CACHE = "cache"
EVENTS_LOG = "events-log"
EVENTS_LOG_SEGMENTS = f"{EVENTS_LOG}/segments"
STAGING = ".staging"
BACKTEST = "backtest"
BACKTEST_EXAMPLES = "backtest_examples"
CONTENDERS = "contenders"
DATASET_MANIFEST = "_manifest.json"
MODEL_MANIFEST = "manifest.json"
CHECKPOINT_STATE = "state.pt"

_EVENTS_LOG_SEGMENT = re.compile(rf"^{EVENTS_LOG_SEGMENTS}/(\d{{12}})\.parquet$")
_SCORING_FEATURES_MANIFEST = re.compile(
    rf"^{FEATURES}/as_of=(\d{{4}}-\d{{2}}-\d{{2}})/{re.escape(DATASET_MANIFEST)}$"
)
_RUN_DATASET_MANIFEST = re.compile(
    rf"^((?:{FEATURES}|{SNAPSHOTS}(?:/{BACKTEST})?)/as_of=(\d{{4}}-\d{{2}}-\d{{2}})(?:_h(\d+))?"
    rf"/run=([^/]+))/{re.escape(DATASET_MANIFEST)}$"
)


# runs and their stage outputs


RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""A run id: a flow-run id, a run key ``run-<sha>`` or a name a user gave; one path segment."""


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is one (letters, digits, ``_ . -``; no path); else an input error."""
    if not RUN_ID.match(run_id) or ".." in run_id:
        raise HybridflowInputError(
            f"not a run id: {run_id!r} (run ids are letters, digits, '-', '_' and '.', as "
            "printed by 'hybridflow features' and 'hybridflow run')"
        )
    return run_id


def stage_manifest_key(run_id: str, stage: str) -> str:
    """Where a stage of a run publishes its result (the last thing it writes)."""
    return f"{RUNS}/{check_run_id(run_id)}/{stage}.json"


def run_dataset_prefix(run_id: str, name: str) -> str:
    """A dataset that belongs to one run: ``events``, ``quarantine``, ``training_examples``,
    ``backtest_examples`` (:data:`BACKTEST_EXAMPLES`)."""
    return f"{RUNS}/{run_id}/{name}"


def backtest_examples_prefix(run_id: str) -> str:
    """The run's backtest training examples: features at T-2H, labels in (T-2H, T-H]."""
    return run_dataset_prefix(run_id, BACKTEST_EXAMPLES)


def contender_bundle_key(run_id: str, family: str, name: str) -> str:
    """A file of the bundle a contender unit fitted, kept for the run's train stage, which
    registers it (with the run's leaderboard) once every contender is judged."""
    return f"{RUNS}/{run_id}/{CONTENDERS}/{family}/{name}"


def _run_folder(run_id: str | None) -> str:
    return f"/run={run_id}" if run_id else ""


def scoring_features_prefix(as_of: dt.date, run_id: str | None = None) -> str:
    """A run's features to score (and serve with the model it trains) for an as-of date; no
    other run ever writes there. Without ``run_id``: the one dataset per date of earlier
    releases (and of hand-made stores such as the serving sample)."""
    return f"{FEATURES}/as_of={as_of.isoformat()}{_run_folder(run_id)}"


def scoring_features_date(manifest_key: str) -> dt.date | None:
    """The as-of date of a run-less scoring-feature dataset's manifest key, None for any other
    key (:func:`run_dataset_of` reads the keys of a run's)."""
    match = _SCORING_FEATURES_MANIFEST.match(manifest_key)
    return dt.date.fromisoformat(match.group(1)) if match else None


def run_dataset_of(manifest_key: str) -> tuple[str, dt.date, int | None, str] | None:
    """``(prefix, as_of, horizon_days or None, run_id)`` of the manifest key of a run's scoring
    features or (backtest) training snapshot, None for any other key."""
    match = _RUN_DATASET_MANIFEST.match(manifest_key)
    if match is None:
        return None
    prefix, day, horizon, run_id = match.groups()
    return prefix, dt.date.fromisoformat(day), int(horizon) if horizon else None, run_id


def snapshot_prefix(as_of: dt.date, horizon_days: int, run_id: str | None = None) -> str:
    """A run's training snapshot for an as-of date and horizon (without ``run_id``: the one
    of earlier releases, shared by every run of that date and horizon)."""
    return f"{SNAPSHOTS}/as_of={as_of.isoformat()}_h{horizon_days}{_run_folder(run_id)}"


def backtest_snapshot_prefix(as_of: dt.date, horizon_days: int, run_id: str | None = None) -> str:
    """The snapshot the out-of-time backtest trains on (the run at T-H, H days earlier)."""
    return f"{SNAPSHOTS}/{BACKTEST}/as_of={as_of.isoformat()}_h{horizon_days}{_run_folder(run_id)}"


def synthetic_snapshot_prefix(name: str) -> str:
    """A synthetic snapshot (benchmarks and tests of the train stage)."""
    return f"{SNAPSHOTS}/synthetic-{name}"


def predictions_prefix(as_of: dt.date) -> str:
    """Batch predictions for an as-of date (re-scoring replaces them)."""
    return f"{PREDICTIONS}/as_of={as_of.isoformat()}"


# datasets


def dataset_manifest_key(prefix: str) -> str:
    """The manifest that publishes the dataset at ``prefix``."""
    return f"{prefix.strip('/')}/{DATASET_MANIFEST}"


def dataset_data_prefix(prefix: str, generation: str) -> str:
    """One immutable generation of the dataset at ``prefix``."""
    return f"{prefix.strip('/')}/data-{generation}"


def dataset_generation_folder(prefix: str, key: str) -> str | None:
    """The ``<prefix>/data-<id>`` folder that ``key`` lies in, None for other keys."""
    rest = key[len(prefix.strip("/")) + 1 :]
    head, sep, _ = rest.partition("/")
    return f"{prefix.strip('/')}/{head}" if head.startswith("data-") and sep else None


HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark's folder name for a null value


def dataset_part_key(data_prefix: str, partition: dict[str, str | None], part_id: str) -> str:
    """One Parquet file of a dataset generation, under Spark's ``column=value/`` folders for the
    partition columns (``partition_by``), values percent-encoded as Spark escapes them."""
    folders = "".join(
        f"{name}={HIVE_NULL_PARTITION if value is None else quote(value, safe='')}/"
        for name, value in partition.items()
    )
    return f"{data_prefix.strip('/')}/{folders}part-{part_id}.parquet"


def dataset_partition_values(data_prefix: str, key: str) -> dict[str, str | None]:
    """The partition column values a file's key holds (inverse of :func:`dataset_part_key`)."""
    rest = key[len(data_prefix.strip("/")) + 1 :].split("/")[:-1]
    values: dict[str, str | None] = {}
    for folder in rest:
        name, sep, value = folder.partition("=")
        if sep:
            values[name] = None if value == HIVE_NULL_PARTITION else unquote(value)
    return values


# the model registry


def version_prefix(version: str) -> str:
    """The folder of one immutable model version."""
    return f"{VERSIONS}/{version}"


def version_file_key(version: str, name: str) -> str:
    """A file of a model version (``model.pt``, ``model.json``)."""
    return f"{VERSIONS}/{version}/{name}"


def version_manifest_key(version: str) -> str:
    """A version's manifest; the version exists once this does."""
    return version_file_key(version, MODEL_MANIFEST)


def is_version_manifest_key(key: str) -> bool:
    """True for ``models/versions/<version>/manifest.json``."""
    return key.startswith(f"{VERSIONS}/") and key.endswith(f"/{MODEL_MANIFEST}")


def alias_key(alias: str) -> str:
    """An alias (``production``) and its history."""
    return f"{ALIASES}/{alias}.json"


# training checkpoints


def checkpoints_prefix(training_id: str) -> str:
    """Every checkpoint of one training run."""
    return f"{CHECKPOINTS}/{training_id}"


def checkpoint_state_key(training_id: str, step: int) -> str:
    """The state file of the checkpoint at ``step``."""
    return f"{checkpoint_step_prefix(training_id, step)}/{CHECKPOINT_STATE}"


def checkpoint_step_prefix(training_id: str, step: int) -> str:
    """The folder of the checkpoint at ``step``."""
    return f"{CHECKPOINTS}/{training_id}/step-{step:010d}"


def checkpoint_manifest_key(training_id: str, step: int) -> str:
    """The manifest of the checkpoint at ``step`` (written after its state)."""
    return f"{CHECKPOINTS}/{training_id}/manifest-{step:010d}.json"


def checkpoint_key_step(training_id: str, key: str) -> tuple[str, int] | None:
    """``("manifest"|"step", n)`` for a key under the training's checkpoints, else None."""
    rest = key[len(checkpoints_prefix(training_id)) + 1 :]
    head = rest.split("/", 1)[0]
    for kind in ("manifest", "step"):
        if head.startswith(f"{kind}-"):
            digits = head[len(kind) + 1 :].removesuffix(".json")
            if digits.isdigit():
                return kind, int(digits)
    return None


# routing, costs, cache


def profile_key(stage: str, pool: str, recorded_at: dt.datetime, token: str) -> str:
    """One measured stage run."""
    return f"{PROFILES}/{stage}/{pool}/{recorded_at:%Y%m%dT%H%M%S%f}-{token}.json"


def profiles_prefix(stage: str | None = None) -> str:
    """Every profile, or those of one stage."""
    return f"{PROFILES}/{stage}" if stage else PROFILES


def cost_report_key(day: dt.date, run_id: str) -> str:
    """A run's cost report, filed under the day it was made."""
    return f"{COSTS}/{day:%Y-%m-%d}/{run_id}.json"


def cost_report_day(key: str) -> str:
    """``YYYY-MM-DD`` of a cost report key."""
    return key.split("/")[1]


def drift_reference_key(version: str) -> str:
    """A model version's drift reference: training-side bin edges and shares, score shares."""
    return f"{DRIFT_REFERENCES}/{version}.json"


def drift_customers_prefix(version: str) -> str:
    """The customer ids a model version was trained on (for the unseen-customers share)."""
    return f"{DRIFT_REFERENCES}/{version}/customers"


def cache_key(stage: str, fingerprint: str) -> str:
    """The reusable output of a CPU stage for an input fingerprint."""
    return f"{CACHE}/{stage}/{fingerprint}.json"


# the events log


def events_log_segment_key(seq: int) -> str:
    """Segment ``seq`` (1, 2, ...) of the events log: accepted events, written once, in order;
    the segments folder is a Parquet folder a batch run reads (``hybridflow run --events``)."""
    if seq < 1:
        raise ValueError(f"segment numbers start at 1, not {seq}")
    return f"{EVENTS_LOG_SEGMENTS}/{seq:012d}.parquet"


def events_log_segment_seq(key: str) -> int | None:
    """The number of a segment's key, None for any other key."""
    match = _EVENTS_LOG_SEGMENT.match(key)
    return int(match.group(1)) if match else None


def events_log_reader_key(reader: str) -> str:
    """How far a reader of the events log got (a small JSON record it moves on)."""
    return f"{EVENTS_LOG}/readers/{reader}.json"
