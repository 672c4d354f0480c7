"""Before training starts: warm start or scratch, and the run's stable training id."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from infra.registry import AliasRecord, ModelRegistry
from infra.settings import TrainingSettings
from infra.store import sha256_bytes
from tasks.ml.calibration import Calibration
from tasks.ml.model import CustomerMLP, Normalizer, load_bundle, with_calibration
from tasks.ml.training_loop import build_model

log = logging.getLogger(__name__)
CODE_VERSION = "hybridflow-0.2.0"  # 0.2: calibration in the bundle, backtest in the manifest
ID_FIELDS = (
    "hidden_sizes",
    "dropout",
    "learning_rate",
    "weight_decay",
    "batch_size",
    "max_epochs",
    "patience",
    "seed",
    "calibration",
)


@dataclass
class StartPoint:
    """The model training starts from and why."""

    model: CustomerMLP
    warm_start: bool
    parent_version: str | None
    learning_rate: float
    reason: str


def choose_start(
    registry: ModelRegistry,
    production: AliasRecord | None,
    normalizer: Normalizer,
    settings: TrainingSettings,
    force_scratch: bool = False,
) -> StartPoint:
    """Warm start from production (lower learning rate) when its features and architecture match
    the snapshot; otherwise a fresh model. ``force_scratch`` or ``warm_start=False`` skip it."""

    def scratch(reason: str) -> StartPoint:
        return StartPoint(
            build_model(normalizer, settings), False, None, settings.learning_rate, reason
        )

    if force_scratch or not settings.warm_start:
        return scratch("scratch: warm start switched off")
    if production is None:
        return scratch("scratch: no production model yet")
    manifest, files = registry.read_files(production.version)
    if manifest.features != normalizer.features:
        return scratch(f"scratch: production {production.version} uses other features")
    model = load_bundle(files, manifest.files)
    if model.config.hidden_sizes != settings.hidden_sizes:
        return scratch(f"scratch: production {production.version} has another architecture")
    with_calibration(model, Calibration())  # refitted for the new weights after training
    model.train()
    return StartPoint(
        model=model,
        warm_start=True,
        parent_version=production.version,
        learning_rate=settings.learning_rate * settings.warm_start_lr_factor,
        reason=f"warm start from production {production.version}",
    )


def training_id(fingerprint: str, settings: TrainingSettings, start: StartPoint) -> str:
    """A stable id for "this data, these hyper-parameters, this starting point": a retry or a
    re-run with the same inputs gets the same id and resumes its checkpoints."""
    params = {name: getattr(settings, name) for name in ID_FIELDS}
    key = {
        "data": fingerprint,
        "params": params,
        "parent": start.parent_version,
        "lr": start.learning_rate,
        "code": CODE_VERSION,
    }
    return "t-" + sha256_bytes(json.dumps(key, sort_keys=True).encode())[:16]
