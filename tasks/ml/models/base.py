"""What a model family is to the rest of hybridflow: a spec, a fit, a bundle, logits.

Every caller (training, the backtest, calibration, the gate, batch scoring, the endpoint, the
router) holds a :class:`FittedModel` and asks its family (:class:`ModelFamily`, found by ``kind``
in :mod:`tasks.ml.models.registry`) for everything else; none of them knows a concrete class.

A fitted model maps raw feature rows (in ``features`` order) to logits; its
:class:`~tasks.ml.calibration.Calibration` turns logits into the probabilities it serves, the
same way for every family. Its bundle is a dict of files: ``model.json`` (which names the
``kind``) plus whatever the family needs, in formats that never execute code on load (JSON, npz,
text, or a ``state_dict`` read with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.compute.devices import Device
from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.metrics import classification_metrics
from tasks.ml.normalizer import Normalizer

if TYPE_CHECKING:  # torch-free at import: planning asks families for cost hints (no torch)
    from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
    from tasks.ml.ddp import DistContext
    from tasks.ml.snapshot_reader import SnapshotStream

CONFIG_FILE = "model.json"
PARALLEL_FIT_ROWS = 200_000  # below this, one thread fits faster than a busy machine's cores
Scorer = Callable[[np.ndarray], np.ndarray]


class FamilySpec(BaseModel):
    """A family's hyper-parameters; each family subclasses it with ``kind: Literal[...]``."""

    model_config = ConfigDict(extra="forbid")

    kind: str


class CostHints(BaseModel):
    """What the router needs to know about fitting and scoring one model of a family."""

    parameters: int = Field(description="learned numbers (weights, coefficients, tree nodes)")
    train_flops_per_row: float = Field(description="FLOPs per training row, all passes included")
    score_flops_per_row: float = Field(description="FLOPs to score one row")
    network: bool = Field(description="dense tensor work that a GPU speeds up")


class FittedModel(ABC):
    """A trained model of some family: logits for raw features, its calibration, its bundle."""

    kind: ClassVar[str]

    @property
    @abstractmethod
    def features(self) -> list[str]:
        """The raw feature columns it reads, in order."""

    @property
    @abstractmethod
    def calibration(self) -> Calibration:
        """logit -> probability (the identity until fitted on held-out rows)."""

    @abstractmethod
    def with_calibration(self, calibration: Calibration) -> FittedModel:
        """This model with ``calibration`` (in place where the family allows; returned)."""

    @abstractmethod
    def logits(self, x: np.ndarray) -> np.ndarray:
        """Raw logits (float64) for a 2-D array of raw features in :attr:`features` order."""

    @abstractmethod
    def bundle_files(self) -> dict[str, bytes]:
        """The bundle: ``model.json`` (with ``kind``) and the family's other files."""

    @property
    @abstractmethod
    def n_parameters(self) -> int:
        """Learned numbers in the model (the card's and the leaderboard's "size")."""

    def describe(self) -> str:
        """One line for the leaderboard and the card."""
        return f"{self.kind}, {self.n_parameters:,} parameters"

    def fast_scorer(self) -> Scorer | None:
        """A lower-overhead path for single requests giving the same probabilities as
        :func:`predict_proba` (the endpoint checks that on its warm-up batch); None: use it."""
        return None


class ConfiguredModel(FittedModel):
    """A fitted model whose pydantic :attr:`config` (``model.json``) holds its features and its
    calibration."""

    config: Any

    @property
    def features(self) -> list[str]:
        return list(self.config.features)

    @property
    def calibration(self) -> Calibration:
        return self.config.calibration

    def with_calibration(self, calibration: Calibration) -> Self:
        self.config = self.config.model_copy(update={"calibration": calibration})
        return self

    def config_file(self) -> dict[str, bytes]:
        """``model.json``: the config as the bundle stores it."""
        return {CONFIG_FILE: self.config.model_dump_json(indent=2).encode()}


@dataclass
class FitJob:
    """What a family's ``fit`` gets: the snapshot, its normaliser and the training settings;
    where to run (device, DDP ranks), a warm-start model of the same family, and the
    checkpoints of this training (None: no checkpoints, e.g. the backtest's fit);
    ``plan_rows``: the training rows a network's batch, learning rate and threads, or the gbm's
    trees, are planned for (None: ``data``'s; the backtest's fit on a sample names the rows it
    stands for)."""

    data: SnapshotStream
    normalizer: Normalizer
    settings: TrainingSettings
    device: Device = field(default_factory=Device)
    ctx: DistContext = field(default_factory=lambda: _single_process())
    start: FittedModel | None = None
    checkpoints: CheckpointStore | None = None
    checkpoint_policy: CheckpointPolicy | None = None
    stop_after_steps: int | None = None
    plan_rows: int | None = None


def _single_process() -> DistContext:
    from tasks.ml.ddp import DistContext

    return DistContext()


@dataclass
class FitOutcome:
    """The fitted model and how fitting went (``record`` goes into the version's manifest)."""

    model: FittedModel
    seconds: float
    record: dict[str, Any] = field(default_factory=dict)
    history: list[Any] = field(default_factory=list)
    interrupted: bool = False


class ModelFamily(ABC):
    """One family: its spec type, how it fits, loads, warm-starts and what it costs."""

    kind: ClassVar[str]
    spec_type: ClassVar[type[FamilySpec]]

    def spec(self, overrides: dict[str, Any] | None = None) -> FamilySpec:
        """The family's spec: its defaults with ``overrides`` (a clear error for unknown keys)."""
        return self.spec_type.model_validate({**(overrides or {}), "kind": self.kind})

    @abstractmethod
    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        """Fit on ``job.data``'s train split (the val split only for early stopping)."""

    @abstractmethod
    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> FittedModel:
        """Rebuild a model from its bundle (checksums already verified)."""

    @abstractmethod
    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ) -> CostHints:
        """Size and work of one model of ``spec`` on ``n_features`` features (and, where the
        features stage publishes them, each customer's last ``sequence_length`` events)."""

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
        """A model to continue fitting from ``production`` (same kind and features), or why
        it cannot be (the default: this family always fits fresh)."""
        return f"{self.kind} models are fitted fresh, not fine-tuned"

    def training_key(self, spec: FamilySpec, settings: TrainingSettings) -> dict[str, Any]:
        """What, besides the data and the starting point, determines a fit (the training id)."""
        return {"spec": spec.model_dump(mode="json"), "seed": settings.seed}


def predict_proba(model: FittedModel, x: np.ndarray, *, calibrated: bool = True) -> np.ndarray:
    """Purchase probabilities (float64): the model's calibration applied to its logits
    (``calibrated=False``: the raw sigmoid)."""
    calibration = model.calibration if calibrated else Calibration()
    return calibration.probabilities(model.logits(x))


def fit_threads(rows: int, setting: int = 0) -> int:
    """Threads for a CPU fit of ``rows`` rows: the setting (``HYBRIDFLOW_TRAIN__THREADS``),
    else one below :data:`PARALLEL_FIT_ROWS` (OpenMP/BLAS workers spinning on a shared 2-core
    box made a 12k-row fit 5-16x slower), else every available core."""
    from infra.compute.devices import available_cores

    return setting or (1 if rows < PARALLEL_FIT_ROWS else available_cores())


_threads_lock = threading.Lock()
_threads_open: list[int] = []  # what each open block asked for, in the order they opened
_threads_before: list[int] = []  # the setting before the first of them


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (:func:`fit_threads`) for the block; when it
    ends, set to what the newest block still open asked for, or restored once none is: fits on
    several threads of one process (an embedded run's contenders at once) never restore the
    setting under one another."""
    import torch

    with _threads_lock:
        if not _threads_open:
            _threads_before[:] = [torch.get_num_threads()]
        _threads_open.append(threads)
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        with _threads_lock:
            del _threads_open[len(_threads_open) - 1 - _threads_open[::-1].index(threads)]
            torch.set_num_threads(_threads_open[-1] if _threads_open else _threads_before[0])


def split_arrays(data: SnapshotStream, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The raw features (float32, rows x features) and labels of one split, in file order
    (:meth:`SnapshotStream.arrays`: one copy)."""
    return data.arrays(split)


def evaluate(
    model: FittedModel, data: SnapshotStream, split: str, *, calibrated: bool = True
) -> dict[str, float]:
    """Metrics of ``model`` on ``split`` of ``data`` (read as the model's inputs), streamed
    chunk by chunk."""
    ys, ps = [], []
    for x, y in data.with_features(model.features).chunks(split):
        ys.append(y)
        ps.append(predict_proba(model, x, calibrated=calibrated))
    return classification_metrics(np.concatenate(ys), np.concatenate(ps))
