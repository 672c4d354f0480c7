"""Settings for every part of hybridflow: one pydantic-settings model, env prefix ``HYBRIDFLOW_``."""

from __future__ import annotations

import datetime as dt
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainingSettings(BaseSettings):
    """Model and optimiser hyper-parameters (``HYBRIDFLOW_TRAIN__*``)."""

    model_config = SettingsConfigDict(extra="ignore")

    hidden_sizes: list[int] = Field(default=[64, 32], description="MLP hidden layer widths")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    learning_rate: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    batch_size: int = Field(default=1024, ge=8)
    max_epochs: int = Field(default=30, ge=1)
    patience: int = Field(default=3, ge=1, description="epochs without val improvement before stop")
    seed: int = 7


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
    spark_arrow_batch_size: int = Field(default=10_000, ge=100)
    progress_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between progress log lines/artifact updates"
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict, description="extra spark.* settings passed through verbatim"
    )

    as_of: dt.date | None = Field(default=None, description="default as-of date (T)")
    horizon_days: int = Field(default=90, ge=1, le=3650)
    max_bad_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    promotion_margin: float = Field(
        default=0.0, ge=0.0, description="test AUC a candidate must gain over production"
    )

    train: TrainingSettings = Field(default_factory=TrainingSettings)

    @field_validator("spark_conf")
    @classmethod
    def _only_spark_keys(cls, conf: dict[str, str]) -> dict[str, str]:
        bad = [k for k in conf if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"spark_conf keys must start with 'spark.': {', '.join(bad)}")
        return conf

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to record in manifests and logs (no credentials live here)."""
        return self.model_dump(mode="json")


@lru_cache(maxsize=1)
def get_settings() -> HybridflowSettings:
    """The process-wide settings (environment read once)."""
    return HybridflowSettings()
