"""What the torch network families (``mlp``, ``sequence``) share.

A network family's module is an ``nn.Module`` whose ``config`` (a pydantic model) holds the
architecture, features, normaliser and calibration. Its bundle is ``model.json`` (that config)
and ``model.pt`` (a ``state_dict`` of plain tensors, read back with
``torch.load(weights_only=True)``); it fits through :func:`tasks.ml.network_fit.fit_network`
(checkpoints and resume, DDP, bf16/TF32 on CUDA, ``torch.compile``), warm-starting from a
production model of its own family at ``warm_start_lr_factor`` times the learning rate.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from infra.errors import ChecksumMismatchError
from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import FamilySpec, FitJob, FitOutcome, ModelFamily

if TYPE_CHECKING:
    from torch import nn

    from tasks.ml.models.network_model import NetworkModel

WEIGHTS_FILE = "model.pt"
OPTIMISER_FIELDS = (
    "learning_rate",
    "weight_decay",
    "batch_size",
    "max_batch_size",
    "max_epochs",
    "patience",
    "seed",
)


class NetworkFamily(ModelFamily):
    """Fit, load and warm start for a family whose model is a :class:`NetworkModel`."""

    config_type: ClassVar[type[BaseModel]]
    network_module: ClassVar[str]
    """The module (torch) that defines the family's ``NETWORK_TYPE`` (the ``nn.Module``) and
    ``MODEL_TYPE`` (its :class:`NetworkModel`), imported on first use: the family's spec and
    cost hints, which routing reads before any stage, need no torch."""

    @property
    def network_type(self) -> type[nn.Module]:
        return importlib.import_module(self.network_module).NETWORK_TYPE

    @property
    def model_type(self) -> type[NetworkModel]:
        return importlib.import_module(self.network_module).MODEL_TYPE

    @abstractmethod
    def build(self, spec: Any, job: FitJob) -> nn.Module:
        """A fresh network for the job's snapshot (seeded)."""

    def job_for(self, network: nn.Module, job: FitJob) -> FitJob:
        """The job as ``network`` reads it (e.g. with its input columns selected)."""
        return job

    def network_from_state(self, state: dict[str, Any]) -> nn.Module:
        from tasks.ml.models.network_model import restore_network

        return restore_network(self.network_type, self.config_type, state)

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        from tasks.ml.network_fit import fit_network, outcome_record

        assert isinstance(spec, self.spec_type)
        settings = job.settings
        if isinstance(job.start, self.model_type):
            network = job.start.network
            network.config = network.config.model_copy(update={"calibration": Calibration()})
            network.train()
            learning_rate = settings.learning_rate * settings.warm_start_lr_factor
        else:
            network = self.build(spec, job)
            learning_rate = settings.learning_rate
        job = self.job_for(network, job)
        outcome = fit_network(network, job, learning_rate, self.network_from_state)
        trained = outcome.model.cpu().eval()
        assert isinstance(trained, self.network_type)
        return FitOutcome(
            model=self.model_type(trained),
            seconds=outcome.seconds,
            record=outcome_record(outcome, learning_rate, job.ctx.world_size)
            | {"checkpoints_written": outcome.checkpoints_written},
            history=outcome.history,
            interrupted=outcome.interrupted,
        )

    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> NetworkModel:
        from tasks.ml.weights import load_weights

        if WEIGHTS_FILE not in files:
            raise ChecksumMismatchError(f"model bundle lacks {WEIGHTS_FILE} or its checksum")
        network = self.network_type(self.config_type.model_validate(config))
        network.load_state_dict(load_weights(files[WEIGHTS_FILE]))
        return self.model_type(network)

    def training_key(self, spec: FamilySpec, settings: TrainingSettings) -> dict[str, Any]:
        fields = {f: getattr(settings, f) for f in OPTIMISER_FIELDS}
        return super().training_key(spec, settings) | fields


def __getattr__(name: str) -> Any:
    """:class:`NetworkModel` and :func:`restore_network` (torch), imported on first use."""
    if name in ("NetworkModel", "restore_network"):
        from tasks.ml.models import network_model

        return getattr(network_model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
