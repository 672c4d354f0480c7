"""What the torch network families (``mlp``, ``sequence``) share.

A network family's module is an ``nn.Module`` whose ``config`` (a pydantic model) holds the
architecture, features, normaliser and calibration. Its bundle is ``model.json`` (that config)
and ``model.pt`` (a ``state_dict`` of plain tensors, read back with
``torch.load(weights_only=True)``); it fits through :func:`tasks.ml.network_fit.fit_network`
(checkpoints and resume, DDP, bf16/TF32 on CUDA, ``torch.compile``), warm-starting from a
production model of its own family at ``warm_start_lr_factor`` times the learning rate.
"""

from __future__ import annotations

import io
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel
from torch import nn

from infra.errors import ChecksumMismatchError
from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import (
    ConfiguredModel,
    FamilySpec,
    FitJob,
    FitOutcome,
    ModelFamily,
)
from tasks.ml.network_fit import fit_network, outcome_record, state_dict_cpu
from tasks.ml.training_loop import network_logits
from tasks.ml.weights import load_weights

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


class NetworkModel(ConfiguredModel):
    """A trained network (in eval mode) as the seam sees it; ``network.config`` is its config."""

    def __init__(self, network: nn.Module) -> None:
        self.network = network.eval()

    @property  # type: ignore[override]
    def config(self) -> Any:
        return self.network.config

    @config.setter
    def config(self, config: Any) -> None:
        self.network.config = config

    def logits(self, x: np.ndarray) -> np.ndarray:
        return network_logits(self.network, x)

    def bundle_files(self) -> dict[str, bytes]:
        buf = io.BytesIO()
        torch.save(state_dict_cpu(self.network), buf)
        return self.config_file() | {WEIGHTS_FILE: buf.getvalue()}

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.network.parameters())


def restore_network(
    network_type: type[nn.Module], config_type: type[BaseModel], state: dict[str, Any]
) -> nn.Module:
    """The network saved in a checkpoint state (``model_config`` + ``model``)."""
    network = network_type(config_type.model_validate(state["model_config"]))
    network.load_state_dict(state["model"])
    return network


class NetworkFamily(ModelFamily):
    """Fit, load and warm start for a family whose model is a :class:`NetworkModel`."""

    network_type: ClassVar[type[nn.Module]]
    config_type: ClassVar[type[BaseModel]]
    model_type: ClassVar[type[NetworkModel]]

    @abstractmethod
    def build(self, spec: Any, job: FitJob) -> nn.Module:
        """A fresh network for the job's snapshot (seeded)."""

    def job_for(self, network: nn.Module, job: FitJob) -> FitJob:
        """The job as ``network`` reads it (e.g. with its input columns selected)."""
        return job

    def network_from_state(self, state: dict[str, Any]) -> nn.Module:
        return restore_network(self.network_type, self.config_type, state)

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
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
        if WEIGHTS_FILE not in files:
            raise ChecksumMismatchError(f"model bundle lacks {WEIGHTS_FILE} or its checksum")
        network = self.network_type(self.config_type.model_validate(config))
        network.load_state_dict(load_weights(files[WEIGHTS_FILE]))
        return self.model_type(network)

    def training_key(self, spec: FamilySpec, settings: TrainingSettings) -> dict[str, Any]:
        fields = {f: getattr(settings, f) for f in OPTIMISER_FIELDS}
        return super().training_key(spec, settings) | fields
