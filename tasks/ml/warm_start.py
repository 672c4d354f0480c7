"""Before a family is fitted: warm start from production or a fresh fit, and the stable
training id of "this data, this family's spec, this starting point"."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from infra.settings import TrainingSettings
from infra.storage.registry import AliasRecord, ModelRegistry
from infra.storage.store import sha256_bytes
from tasks.ml.calibration import Calibration
from tasks.ml.models import FamilySpec, FittedModel, get_family, load_model
from tasks.ml.normalizer import Normalizer

log = logging.getLogger(__name__)
CODE_VERSION = "hybridflow-0.3.0"  # 0.3: model families (the bundle records its kind)


@dataclass
class StartPoint:
    """The model a fit starts from (None: a fresh one) and why."""

    model: FittedModel | None
    parent_version: str | None
    reason: str

    @property
    def warm_start(self) -> bool:
        return self.model is not None


def choose_start(
    registry: ModelRegistry,
    production: AliasRecord | None,
    normalizer: Normalizer,
    spec: FamilySpec,
    settings: TrainingSettings,
    force_scratch: bool = False,
) -> StartPoint:
    """Warm start from production when it is of ``spec``'s family, reads the snapshot's
    features and its family says it can continue from it; otherwise a fresh fit, and the
    reason says why. ``force_scratch`` or ``warm_start=False`` skip it."""
    if force_scratch or not settings.warm_start:
        return StartPoint(None, None, "scratch: warm start switched off")
    if production is None:
        return StartPoint(None, None, "scratch: no production model yet")
    version = production.version
    manifest, files = registry.read_files(version)
    if manifest.features != normalizer.features:
        return StartPoint(None, None, f"scratch: production {version} uses other features")
    model = load_model(files, manifest.files)
    if model.kind != spec.kind:
        return StartPoint(
            None,
            None,
            f"scratch: production {version} is a {model.kind} model, this fit is {spec.kind}",
        )
    start = get_family(spec.kind).warm_start(model, spec)
    if isinstance(start, str):
        return StartPoint(None, None, f"scratch: production {version}: {start}")
    start.with_calibration(Calibration())  # refitted for the new weights after training
    return StartPoint(start, version, f"warm start from production {version}")


def training_id(
    fingerprint: str, spec: FamilySpec, settings: TrainingSettings, start: StartPoint
) -> str:
    """A stable id for "this data, this family and its parameters, this starting point": a
    retry or a re-run with the same inputs gets the same id and resumes its checkpoints."""
    key = {
        "data": fingerprint,
        "params": get_family(spec.kind).training_key(spec, settings)
        | {"warm_start_lr_factor": settings.warm_start_lr_factor, "cal": settings.calibration},
        "parent": start.parent_version,
        "code": CODE_VERSION,
    }
    return "t-" + sha256_bytes(json.dumps(key, sort_keys=True).encode())[:16]
