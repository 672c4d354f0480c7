"""The ``gbm`` family: gradient-boosted trees (LightGBM), what data scientists try first on
tabular data.

Fitted on the raw features (trees do not care about monotone transforms) with early stopping on
the val split's log loss, on all the machine's cores. LightGBM was chosen over scikit-learn's
HistGradientBoosting by measurement (docs/benchmarks.md): on the demo data it fitted faster at
the same backtest log loss, installs in a third of the space, and has a documented text model
format — so the bundle is ``model.json`` plus ``model.txt`` (LightGBM's own text dump, parsed by
its C++ reader: no pickle), both checked by sha256 before loading.

At scale (:func:`gbm_plan`): from :attr:`GBMSpec.large_fit_rows` training rows the trees grow one
level deeper (``2 * num_leaves + 1`` leaves) at twice the learning rate, early stopping after
half the rounds: on 1.1M rows a quarter of the trees, at the held-out log loss of the default's
(docs/benchmarks.md).

Warm start: boosting continues from production's trees (same features) on the new window, with
at most :attr:`GBMSpec.max_rounds` more rounds and the same early stopping.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from infra.compute.devices import intra_op_threads
from infra.errors import ChecksumMismatchError
from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import (
    ConfiguredModel,
    CostHints,
    FamilySpec,
    FitJob,
    FitOutcome,
    FittedModel,
    ModelFamily,
    fit_threads,
    split_arrays,
)
from tasks.ml.models.registry import register_family

TREES_FILE = "model.txt"
log = logging.getLogger(__name__)


class GBMSpec(FamilySpec):
    """LightGBM's main knobs (binary log loss, early stopping on the val split)."""

    kind: Literal["gbm"] = "gbm"
    learning_rate: float = Field(default=0.05, gt=0, le=1)
    num_leaves: int = Field(default=31, ge=2)
    min_data_in_leaf: int = Field(default=50, ge=1)
    feature_fraction: float = Field(default=0.9, gt=0, le=1)
    lambda_l2: float = Field(default=1.0, ge=0)
    max_rounds: int = Field(default=1000, ge=1)
    early_stopping_rounds: int = Field(default=30, ge=1)
    max_bin: int = Field(default=255, ge=2)
    large_fit_rows: int = Field(
        default=500_000,
        ge=0,
        description="from this many training rows (the production fit's, for the backtest's "
        "refit on a sample), trees of 2 * num_leaves + 1 leaves at twice the learning rate, "
        "early stopping after as much learning as the spec's (0: never)",
    )


@dataclass(frozen=True)
class GBMPlan:
    """The learning rate, leaves per tree and early-stopping patience of one fit."""

    learning_rate: float
    num_leaves: int
    early_stopping_rounds: int


def gbm_plan(spec: GBMSpec, train_rows: int) -> GBMPlan:
    """The spec's learning rate, leaves and patience below :attr:`GBMSpec.large_fit_rows`
    training rows; from there trees one level deeper (``2 * num_leaves + 1`` leaves) at twice
    the learning rate (at most 1), and a patience of as much learning as the spec's (its rounds
    times the spec's rate over the plan's: 15 rounds at 0.1 for 30 at 0.05). Measured
    (docs/benchmarks.md, 4 Dec 2026): on 1.1M rows of the 30M-event snapshot 86-119 trees
    against 448-490 at the same val/test log loss, the backtest's 0.0004 better, and the same
    best round with either patience; on 275k rows of it the same log loss; on a 187k-row
    snapshot 0.0003-0.0005 worse on test, so smaller fits keep the spec's trees."""
    if not spec.large_fit_rows or train_rows < spec.large_fit_rows:
        return GBMPlan(spec.learning_rate, spec.num_leaves, spec.early_stopping_rounds)
    rate = min(1.0, 2 * spec.learning_rate)
    patience = round(spec.early_stopping_rounds * spec.learning_rate / rate)
    return GBMPlan(rate, 2 * spec.num_leaves + 1, max(1, patience))


_READ_AS_IS = (np.dtype(np.float32), np.dtype(np.float64))


class GBMConfig(BaseModel):
    """What ``model.json`` says about the trees in ``model.txt``."""

    kind: Literal["gbm"] = "gbm"
    features: list[str]
    trees: int
    leaves: int
    calibration: Calibration = Field(default_factory=Calibration)


class GBMModel(ConfiguredModel):
    """A LightGBM booster; logits are its raw scores."""

    kind = "gbm"

    def __init__(self, config: GBMConfig, trees_text: str) -> None:
        import lightgbm as lgb

        self.config = config
        self.trees_text = trees_text
        self.booster = lgb.Booster(model_str=trees_text)

    def logits(self, x: np.ndarray) -> np.ndarray:
        # LightGBM reads float32 and float64 rows as they are (a float32 feature widens to the
        # same double either way): only other dtypes are converted, no float64 copy of a chunk
        x = np.ascontiguousarray(x, dtype=x.dtype if x.dtype in _READ_AS_IS else np.float64)
        if len(x) == 0:
            return np.empty(0, dtype=np.float64)
        # as many threads as this process gives torch: 1 inside a Spark task or the endpoint
        raw = self.booster.predict(x, raw_score=True, num_threads=intra_op_threads())
        return np.asarray(raw, dtype=np.float64)

    def bundle_files(self) -> dict[str, bytes]:
        return self.config_file() | {TREES_FILE: self.trees_text.encode()}

    @property
    def n_parameters(self) -> int:
        """Split thresholds and leaf values: ``2 * leaves - 1`` per tree."""
        return 2 * self.config.leaves - self.config.trees

    def describe(self) -> str:
        return f"gbm {self.config.trees} trees, {self.config.leaves} leaves"


class GBMFamily(ModelFamily):
    """LightGBM boosting with early stopping on the val split."""

    kind = "gbm"
    spec_type = GBMSpec

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        import lightgbm as lgb

        assert isinstance(spec, GBMSpec)
        started = time.perf_counter()
        x, y = split_arrays(job.data, "train")
        vx, vy = split_arrays(job.data, "val")
        threads = fit_threads(len(y), job.settings.threads)
        plan_rows = job.plan_rows or len(y)
        plan = gbm_plan(spec, plan_rows)
        log.info(
            "gbm on %d rows (planned for %d): learning rate %.3g, %d leaves per tree, early "
            "stopping after %d rounds, %d thread(s)",
            len(y),
            plan_rows,
            plan.learning_rate,
            plan.num_leaves,
            plan.early_stopping_rounds,
            threads,
        )
        params = {
            "objective": "binary",
            "learning_rate": plan.learning_rate,
            "num_leaves": plan.num_leaves,
            "min_data_in_leaf": spec.min_data_in_leaf,
            "feature_fraction": spec.feature_fraction,
            "lambda_l2": spec.lambda_l2,
            "max_bin": spec.max_bin,
            "seed": job.settings.seed,
            "deterministic": True,
            "force_row_wise": True,
            "num_threads": threads,
            "verbosity": -1,
        }
        names = [f"f{i}" for i in range(x.shape[1])]  # LightGBM rejects some column names
        train = lgb.Dataset(x, label=y, feature_name=names, params={"max_bin": spec.max_bin})
        valid = lgb.Dataset(vx, label=vy, reference=train)
        init = job.start.booster if isinstance(job.start, GBMModel) else None
        start_trees = init.num_trees() if init is not None else 0
        booster = lgb.train(
            params,
            train,
            num_boost_round=spec.max_rounds,
            valid_sets=[valid],
            init_model=init,
            callbacks=[lgb.early_stopping(plan.early_stopping_rounds, verbose=False)],
        )
        best = booster.best_iteration or booster.current_iteration()
        text = booster.model_to_string(num_iteration=best)
        model = _from_text(job.normalizer.features, text)
        return FitOutcome(
            model=model,
            seconds=time.perf_counter() - started,
            record={
                "device": "cpu",
                "threads": threads,
                "learning_rate": plan.learning_rate,
                "num_leaves": plan.num_leaves,
                "early_stopping_rounds": plan.early_stopping_rounds,
                "rounds": best - start_trees,
                "trees": model.config.trees,
                "rows": len(y),
            },
        )

    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> GBMModel:
        if TREES_FILE not in files:
            raise ChecksumMismatchError(f"model bundle lacks {TREES_FILE} or its checksum")
        return GBMModel(GBMConfig.model_validate(config), files[TREES_FILE].decode())

    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ) -> CostHints:
        assert isinstance(spec, GBMSpec)
        rounds = min(spec.max_rounds, 300)  # early stopping ends most fits well before the cap
        return CostHints(
            parameters=rounds * (2 * spec.num_leaves - 1),
            train_flops_per_row=rounds * n_features * 8.0,  # histogram building per round
            score_flops_per_row=rounds * np.log2(spec.num_leaves) * 2.0,
            network=False,
        )

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
        return production

    def training_key(self, spec: FamilySpec, settings: TrainingSettings) -> dict[str, Any]:
        return super().training_key(spec, settings) | {"library": _library_version()}


def _from_text(features: list[str], text: str) -> GBMModel:
    """The model of LightGBM's text dump, sized from the dump's own ``Tree=`` and
    ``num_leaves=`` lines (``dump_model()``'s JSON of a thousand trees took longer than the fit)."""
    lines = text.splitlines()
    trees = sum(1 for line in lines if line.startswith("Tree="))
    leaves = sum(
        int(line[len("num_leaves=") :]) for line in lines if line.startswith("num_leaves=")
    )
    return GBMModel(GBMConfig(features=list(features), trees=trees, leaves=leaves), text)


def _library_version() -> str:
    from importlib.metadata import version

    return version("lightgbm")


register_family(GBMFamily())
