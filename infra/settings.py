"""Settings for every part of hybridflow: one pydantic-settings model, env prefix ``HYBRIDFLOW_``."""

from __future__ import annotations

import datetime as dt
import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from infra.routing.pools import PoolSpec, default_pools

StackDatabase = Literal["postgres", "sqlite"]  # the Prefect server's database under `up`
CalibrationMethod = Literal["none", "temperature", "platt", "isotonic"]


HORIZON_DAYS_MIN, HORIZON_DAYS_MAX = 1, 3650
"""The horizon H a run may have, in days: the settings, the run parameters and the CLI check it."""


class TrainingSettings(BaseSettings):
    """Which model families contend, their hyper-parameters, and how networks are trained
    (``HYBRIDFLOW_TRAIN__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    families: Annotated[list[str], NoDecode] = Field(
        default=["rfm", "logistic", "gbm", "mlp"],
        description="model families that contend in every training run (the champion goes to "
        "the promotion gate): any of rfm (the RFM baseline's recipe), logistic, gbm, mlp, "
        "sequence",
    )
    specs: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='per-family hyper-parameters, JSON {"mlp": {"hidden_sizes": [128, 64]}}',
    )
    learning_rate: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    batch_size: int = Field(
        default=1024, ge=8, description="a network's mini-batch below 131,072 training rows"
    )
    max_batch_size: int = Field(
        default=16_384,
        ge=8,
        description="the mini-batch doubles from batch_size with each doubling of the training "
        "rows beyond 65,536, up to this (the learning rate grows by the square root; equal to "
        "batch_size: no scaling)",
    )
    max_epochs: int = Field(default=30, ge=1)
    patience: int = Field(default=3, ge=1, description="epochs without val improvement before stop")
    seed: int = 7
    warm_start: bool = Field(
        default=True, description="fine-tune the production model when its features match"
    )
    warm_start_lr_factor: float = Field(
        default=0.2, gt=0, le=1, description="learning rate multiplier when warm-starting"
    )
    stream_chunk_rows: int = Field(
        default=65_536, ge=64, description="rows read and shuffled together from the snapshot"
    )
    stream_cache_mb: int = Field(
        default=2048, ge=0, description="decoded snapshot kept in memory up to this size"
    )
    compile: bool | None = Field(
        default=None, description="torch.compile the model (default: on CUDA only)"
    )
    threads: int = Field(
        default=0,
        ge=0,
        description="CPU threads of a fit (0: from the cores the stage owns and the work: a "
        "network one per 200M FLOPs of a step, a CPU family one below 200,000 rows)",
    )
    backtest_max_rows: int = Field(
        default=500_000,
        ge=0,
        description="the backtest refits each family at T-2H on a label-free sample of at most "
        "this many training rows (customers chosen by a hash of their id; 0: all rows)",
    )
    ddp_processes: int = Field(
        default=1, ge=1, description="GPUs on the worker: >1 launches torchrun DDP training"
    )
    contenders_at_once: int = Field(
        default=0,
        ge=0,
        description="contenders an embedded run fits at the same time, each on a thread of "
        "its own (0: one per core when every fit is one-threaded, i.e. CPU, under "
        "200,000 training rows, threads 0 or 1, no DDP, one network family at most; else one "
        "at a time)",
    )
    calibration: CalibrationMethod = Field(
        default="temperature",
        description="post-hoc calibration fitted on the val split, kept when it pays there "
        "(cross-validated), stored in the bundle (temperature: best out-of-time log loss "
        "measured; platt also moves the base rate)",
    )

    @field_validator("families", mode="before")
    @classmethod
    def _family_list(cls, value: Any) -> Any:
        """A JSON list or a comma-separated string (``logistic,gbm``)."""
        return parse_family_list(value)


class CheckpointSettings(BaseSettings):
    """Training checkpoints in the store (``HYBRIDFLOW_CHECKPOINT__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    every_steps: int = Field(
        default=0, ge=0, description="also every N optimiser steps (0: by time only)"
    )
    every_seconds: float = Field(
        default=120.0, ge=0, description="a checkpoint every N seconds of training (0: none)"
    )
    keep: int = Field(default=3, ge=1, description="newest checkpoints kept per training run")


class IngestSettings(BaseSettings):
    """Events sent to the endpoint and its online features (``HYBRIDFLOW_SERVE__INGEST__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    online: bool = Field(
        default=True,
        description="keep the per-customer online state and serve fresh features (off: "
        "customer ids are looked up in the snapshot only, POST /events answers 503)",
    )
    token: SecretStr | None = Field(
        default=None, description="bearer token for POST /events; unset = ingestion disabled"
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="largest POST /events body"
    )
    tail_interval_s: float = Field(
        default=1.0, gt=0, description="how often the events log is checked for new segments"
    )
    max_lead_s: float = Field(
        default=300.0,
        ge=0,
        description="events later than the server's clock plus this are refused (in_the_future)",
    )
    worker: Literal["process", "thread"] = Field(
        default="process",
        description="where a batch is parsed, checked, summed and encoded and a segment decoded: "
        "a worker process of the endpoint's own (the requests' process only applies the sums), "
        "or threads of the endpoint's process (its requests wait behind them)",
    )
    worker_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="added to the ingest worker process's niceness: when the CPU is short, the "
        "endpoint's requests go first and ingestion takes what they leave (0: as the endpoint)",
    )
    worker_idle: bool = Field(
        default=True,
        description="run the ingest worker process under Linux's SCHED_IDLE: it takes only the "
        "CPU time no other process wants, and a request's process that wakes up takes the core "
        "from it at once (a niceness only lowers its share); false: at worker_nice alone. "
        "Where the cores are busy with other work, batches wait for them",
    )
    clock: Literal["log", "wall"] = Field(
        default="log",
        description="the day features are computed at: the newest event's (log) or the later of "
        "that and today's UTC date (wall)",
    )


class ServingSettings(BaseSettings):
    """The real-time endpoint (``HYBRIDFLOW_SERVE__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    host: str = Field(default="127.0.0.1", description="bind address (loopback unless told)")
    port: int = Field(default=8000, ge=0, le=65535, description="0 = any free port")
    admin_token: SecretStr | None = Field(
        default=None, description="bearer token for POST /admin/reload; unset = reload disabled"
    )
    poll_interval_s: float = Field(
        default=5.0, gt=0, description="how often the production alias and snapshot are checked"
    )
    max_batch_items: int = Field(default=256, ge=1, description="most items in one batch request")
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="largest request body")
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a request's headers must arrive within this (else 408)"
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request's body must arrive within this (else 408)"
    )
    max_connections: int = Field(
        default=512,
        ge=2,
        description="open connections; a new one over it closes the longest-idle one, else the "
        "slowest header sender (408); only when all are busy with requests does it get 503",
    )
    max_connections_per_client: int = Field(
        default=64,
        ge=1,
        description="open connections from one client address (the same rule, within them)",
    )
    max_header_bytes: int = Field(
        default=16_384,
        ge=1024,
        le=1_048_576,
        description="largest request line + headers (else 431 and the connection is closed)",
    )
    keep_alive_s: float = Field(
        default=5.0, gt=0, description="an idle kept-alive connection is closed after this"
    )
    refusal_log_interval_s: float = Field(
        default=10.0, gt=0, description="refusals are logged as one line of counts this often"
    )
    api_docs: bool = Field(
        default=False,
        description="serve /docs, /redoc and /openapi.json (the two pages load their scripts "
        "from the jsDelivr CDN)",
    )
    torch_threads: int = Field(default=1, ge=1, description="torch intra-op threads")
    ingest: IngestSettings = Field(default_factory=IngestSettings)


class DriftSettings(BaseSettings):
    """Drift of the scoring data against production's training data (``HYBRIDFLOW_DRIFT__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    bins: int = Field(default=10, ge=2, le=100, description="quantile bins per feature")
    psi_threshold: float = Field(
        default=0.1, gt=0, description="a feature's PSI above this is drift (0.1-0.25: moderate)"
    )
    score_psi_threshold: float = Field(
        default=0.1, gt=0, description="the score distribution's PSI above this is drift"
    )
    score_resolution: float = Field(
        default=0.01,
        gt=0,
        lt=0.5,
        description="the score's bins are its reference quantiles rounded to this probability "
        "step (bands at least one step wide)",
    )
    unseen_share_threshold: float = Field(
        default=0.25, gt=0, le=1, description="share of customers unseen in training above this"
    )
    ignore_features: list[str] = Field(
        default=["tenure_days"],
        description="measured and shown, never drift: features that grow with the calendar",
    )
    min_share: float = Field(
        default=1e-4,
        gt=0,
        lt=0.01,
        description="an empty bin counts as this share (PSI stays finite)",
    )
    quantile_accuracy: int = Field(
        default=10_000, ge=100, description="percentile_approx accuracy for the training bin edges"
    )
    in_process_rows: int | None = Field(
        default=None,
        ge=0,
        description="datasets up to this many rows are binned in this process with pyarrow and "
        "numpy (exact quantiles), larger ones by Spark jobs (0: always Spark); unset: the "
        "stages' HYBRIDFLOW_IN_PROCESS_ROWS",
    )


class RefreshSettings(BaseSettings):
    """When model-refresh runs (``HYBRIDFLOW_REFRESH__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    max_production_age_hours: float = Field(
        default=24.0, gt=0, description="new data refreshes production older than this"
    )
    safety_net_hours: float | None = Field(
        default=None,
        ge=0,
        description="`hybridflow up`: interval of the refresh schedule (0: off; unset: prefect.yaml)",
    )
    baseline_interval_hours: float = Field(
        default=6.0, gt=0, description="the fixed schedule `hybridflow cost` compares with"
    )


class HybridflowSettings(BaseSettings):
    """Everything configurable; read from ``HYBRIDFLOW_*`` environment variables or a ``.env``."""

    model_config = SettingsConfigDict(
        env_prefix="HYBRIDFLOW_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    store: str = Field(
        default=".hybridflow/store",
        description="artifact store: a folder path or s3://bucket/prefix",
    )
    work_dir: Path = Field(default=Path(".hybridflow/work"), description="local scratch space")

    spark_master: str = "local[*]"
    spark_driver_memory: str = "4g"
    spark_executor_memory: str = Field(
        default="4g", description="per executor on a cluster (local mode: the driver is it)"
    )
    spark_shuffle_partitions: int = Field(default=8, ge=1)
    spark_local_java_options: str | None = Field(
        default=None,
        description="JVM options of a local[*] driver; unset: chosen by the input's size when "
        "the CLI knows it (the quick JIT tier below 5M rows, the full JIT from there, both with "
        "one GC thread), else the quick tier; empty = the JVM's defaults",
    )
    spark_class_archive: bool = Field(
        default=True,
        description="a local or client-mode driver and every JVM of `hybridflow up`'s cluster "
        "map the installation's JVM class archive when there is one (`hybridflow jvm-archive` "
        "records it; `make install` runs that)",
    )
    spark_class_archive_dir: Path | None = Field(
        default=None,
        description="where the JVM class archive lives; unset: var/hybridflow/jvm in the "
        "Python environment (sys.prefix)",
    )
    spark_arrow_batch_size: int = Field(default=10_000, ge=100)
    in_process_rows: int = Field(
        default=50_000_000,
        ge=0,
        description="the validate, features and preprocess stages compute in the flow's process "
        "(DuckDB, pyarrow) when their input has up to this many rows (input events, valid "
        "events, training examples), and local batch inference scores up to this many rows "
        "there, with Spark jobs above that (0: always Spark)",
    )
    in_process_memory: str | None = Field(
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+)? ?(MB|GB|TB|MiB|GiB|TiB)$",
        description="the most memory DuckDB holds in the flow's process (validate, features), "
        "as a DuckDB memory_limit such as 4GB or 1500MiB; beyond it, it spills to the work dir. "
        "Unset: 40% of this machine's memory (its cgroup limit when lower)",
    )
    progress_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between progress log lines/artifact updates"
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="extra spark.* settings passed through verbatim"
    )
    spark_remote: str | None = Field(
        default=None,
        description="Spark Connect server sc://host:port: the CPU stages run as its client "
        "(wins over spark_master; `hybridflow up` sets it for the cpu-pool worker)",
    )
    spark_shared_filesystem: bool | None = Field(
        default=None,
        description="the cluster's executors see this machine's folders (a folder store, local "
        "events); default: yes for local masters and clusters on 127.0.0.1",
    )

    as_of: dt.date | None = Field(default=None, description="default as-of date (T)")
    horizon_days: int = Field(default=90, ge=HORIZON_DAYS_MIN, le=HORIZON_DAYS_MAX)
    training_origins: int = Field(
        default=1,
        ge=1,
        le=64,
        description="cutoffs the training examples are taken at: T-H and the ones every "
        "origin_stride_days before it (each label window ends at or before T); the backtest "
        "takes as many below T-H. 1 by measurement (docs/benchmarks.md): more origins gain "
        "little log loss on large logs, cost train time and hurt after a recent shift",
    )
    origin_stride_days: int | None = Field(
        default=None, ge=1, le=3650, description="days between training origins (unset: H)"
    )
    sequence_length: int = Field(
        default=0,
        ge=0,
        le=256,
        description="each customer's last N events before each cutoff, published beside the "
        "features as padded seq_* list columns (time gaps, amounts, event types, category and "
        "channel codes) for the sequence family; 0: none",
    )
    max_bad_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    event_time_max_lead_hours: float = Field(
        default=24.0,
        ge=0,
        description="events later than the validating machine's clock plus this many hours are "
        "quarantined (event_time_in_future)",
    )
    max_amount: float = Field(
        default=1e12,
        gt=0,
        description="events with a larger amount are quarantined (amount_too_large): an amount "
        "such as 1e308 would overflow the features computed from it",
    )
    as_of_grace_days: int = Field(
        default=1,
        ge=0,
        le=3650,
        description="an as_of up to this many days after the last valid event's day is taken "
        "without --as-of-after-events (a nightly run at today's date with events up to "
        "yesterday); the run still says what the label window holds",
    )
    event_time_floor: dt.date = Field(
        default=dt.date(1970, 1, 1),
        description="events before the start of this UTC day are quarantined "
        "(event_time_before_floor)",
    )
    column_map: dict[str, str] = Field(
        default_factory=dict,
        description='events column mapping, JSON {"contract_column": "your_column"}; --map wins',
    )
    csv_delimiter: str | None = Field(default=None, description="CSV delimiter (default: detected)")
    csv_quote: str | None = Field(
        default=None, min_length=1, max_length=1, description='CSV quote character (default ")'
    )
    csv_escape: str | None = Field(
        default=None,
        min_length=1,
        max_length=1,
        description="CSV escape before a quote in a quoted value (default: the quote, RFC 4180)",
    )
    timestamp_format: str | None = Field(
        default=None,
        description="event_time format: Spark datetime pattern, epoch_seconds or epoch_millis",
    )
    purchase_event: str | None = Field(
        default=None,
        description="the event_type value that is a purchase besides purchase and its synonyms "
        "(--purchase-event wins)",
    )
    stage_cache: bool = Field(
        default=True,
        description="reuse CPU stage outputs when their input fingerprint is unchanged",
    )
    promotion_margin: float = Field(
        default=0.0,
        ge=0.0,
        description="calibrated log loss a champion must gain over production (the gate's rows)",
    )

    train: TrainingSettings = Field(default_factory=TrainingSettings)
    serve: ServingSettings = Field(default_factory=ServingSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    refresh: RefreshSettings = Field(default_factory=RefreshSettings)

    pools: list[PoolSpec] = Field(
        default_factory=default_pools,
        description="routable work pools with prices (JSON list; see docs/routing-and-cost.md)",
    )
    pool_price_overrides: dict[str, float] = Field(
        default_factory=dict, description='per-pool USD/hour, e.g. {"gpu-pool": 4.9}'
    )

    def priced_pools(self) -> list[PoolSpec]:
        """The pools with per-pool price overrides applied."""
        return [
            p.model_copy(update={"price_per_hour": self.pool_price_overrides[p.name]})
            if p.name in self.pool_price_overrides
            else p
            for p in self.pools
        ]

    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    store_retries: int = Field(default=5, ge=0, description="S3 retries after a failed request")
    store_backoff_s: float = Field(
        default=0.2, ge=0, description="first S3 retry delay; doubles per attempt"
    )

    stack_dir: Path = Field(
        default=Path(".hybridflow/stack"),
        description="`hybridflow up`: PIDs, logs, the Prefect server's SQLite, demo data",
    )
    stack_gpu_slots: int = Field(default=1, ge=1, description="flow runs gpu-pool runs at once")
    stack_heartbeat_seconds: int = Field(
        default=30, ge=30, description="flow-run heartbeat interval on the stack's workers"
    )
    stack_crash_after_seconds: int = Field(
        default=90, ge=45, description="no heartbeat this long -> the run is marked Crashed"
    )
    stack_db: StackDatabase = Field(
        default="postgres", description="`hybridflow up`: the Prefect server's database"
    )
    stack_spark_workers: int = Field(
        default=2, ge=0, description="`hybridflow up`: Spark workers (0: no cluster, local[*])"
    )
    stack_spark_worker_cores: int = Field(default=1, ge=1, description="cores per Spark worker")
    stack_spark_worker_memory: str = Field(
        default="1g", description="memory per Spark worker (its executor's heap)"
    )
    stack_spark_driver_memory: str = Field(
        default="1g", description="heap of the stack's Spark Connect server (the driver)"
    )
    stack_spark_java_options: str | None = Field(
        default=None,
        description="JVM options of every JVM of the stack's Spark cluster (master, workers, "
        "executors, Connect server); unset: the quick JIT tier with one GC thread, which "
        "halves the small cluster's CPU on small inputs; empty = the JVM's defaults",
    )
    dispatch_poll_seconds: float = Field(
        default=1.0, gt=0, description="deployed mode: how often the pipeline polls a stage run"
    )
    dispatch_start_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="deployed mode: a stage run no worker picks up within this is cancelled",
    )
    warm_api: bool = Field(
        default=True,
        description="without PREFECT_API_URL, commands that run flows share a warm Prefect API "
        "the first one starts (127.0.0.1, one per PREFECT_HOME) instead of each starting and "
        "stopping a temporary one; false: a temporary API per command",
    )
    warm_api_idle_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="the warm Prefect API stops itself after this long without a command "
        "using it and without a request (`hybridflow down` stops it at once)",
    )

    @model_validator(mode="after")
    def _drift_follows_in_process_rows(self) -> HybridflowSettings:
        """The drift check's datasets stay in this process as far as the stages' do, unless
        ``HYBRIDFLOW_DRIFT__IN_PROCESS_ROWS`` says otherwise."""
        if self.drift.in_process_rows is None:
            self.drift = self.drift.model_copy(update={"in_process_rows": self.in_process_rows})
        return self

    @field_validator("spark_conf")
    @classmethod
    def _only_spark_keys(cls, conf: dict[str, str]) -> dict[str, str]:
        bad = [k for k in conf if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"spark_conf keys must start with 'spark.': {', '.join(bad)}")
        return conf

    def class_archive_dir(self) -> Path:
        """The folder of the local driver's JVM class archive (:mod:`infra.compute.jvm_archive`)."""
        return self.spark_class_archive_dir or Path(sys.prefix) / "var" / "hybridflow" / "jvm"

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to record in manifests and logs (no credentials live here)."""
        return self.model_dump(mode="json")


def parse_family_list(value: Any) -> Any:
    """``["a", "b"]`` (JSON) or ``a,b`` as a list of names; anything else as given."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [name.strip() for name in text.split(",") if name.strip()]
    return value


@lru_cache(maxsize=1)
def get_settings() -> HybridflowSettings:
    """The process-wide settings (environment read once)."""
    return HybridflowSettings()


def settings_defaults() -> HybridflowSettings:
    """The settings as declared, without reading the environment: what a stage runner called
    without a flow (a test, a benchmark) uses for a value its flow would have passed down from
    the run's settings."""
    return HybridflowSettings.model_construct()


def in_process_rows_or_default(override: int | None) -> int:
    """``override`` (a flow passes its run's ``in_process_rows`` setting), else the declared
    default; never the environment."""
    return settings_defaults().in_process_rows if override is None else override
