"""The ``mlp`` family: a feed-forward network on the normalised features, trained with torch.

Bundle: ``model.json`` (:class:`ModelConfig`: the architecture, feature names, normaliser and
calibration) and ``model.pt`` (a ``state_dict`` of plain tensors, read back with
``torch.load(weights_only=True)``). Bundles written before families existed have the same two
files and no ``kind``; they load here unchanged. Warm start: from a production MLP of the same
architecture and features, at ``warm_start_lr_factor`` times the learning rate.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import CostHints, FamilySpec, FitJob, FittedModel, Scorer
from tasks.ml.models.network import (
    WEIGHTS_FILE,
    NetworkFamily,
    NetworkModel,
    restore_network,
)
from tasks.ml.models.registry import register_family

__all__ = ["WEIGHTS_FILE", "CustomerMLP", "MLPFamily", "MLPModel", "MLPSpec", "ModelConfig"]


class MLPSpec(FamilySpec):
    """The network's architecture (its optimiser settings are ``HYBRIDFLOW_TRAIN__*``)."""

    kind: Literal["mlp"] = "mlp"
    hidden_sizes: list[int] = Field(default=[64, 32], description="hidden layer widths")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)


class ModelConfig(BaseModel):
    """Everything needed to rebuild the network before loading its weights."""

    kind: Literal["mlp"] = "mlp"
    features: list[str]
    hidden_sizes: list[int]
    dropout: float
    norm_mean: list[float]
    norm_std: list[float]
    calibration: Calibration = Field(
        default_factory=Calibration, description="logit -> probability (identity if absent)"
    )


class CustomerMLP(nn.Module):
    """Raw features in, purchase logit out; the train-fitted normaliser is part of the model."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        n = len(config.features)
        self.register_buffer("norm_mean", torch.tensor(config.norm_mean, dtype=torch.float32))
        self.register_buffer("norm_std", torch.tensor(config.norm_std, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = n
        for h in config.hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(config.dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(signed_log1p(x) - mean) / std``, matching :mod:`tasks.data.split`."""
        return (torch.sign(x) * torch.log1p(torch.abs(x)) - self.norm_mean) / self.norm_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(x)).squeeze(-1)


class MLPModel(NetworkModel):
    """A trained :class:`CustomerMLP` (in eval mode) as the seam sees it."""

    kind = "mlp"
    network: CustomerMLP

    def describe(self) -> str:
        widths = [len(self.features), *self.network.config.hidden_sizes, 1]
        return f"mlp {'-'.join(map(str, widths))}, {self.n_parameters:,} parameters"

    def fast_scorer(self) -> Scorer | None:
        return fast_scorer(self.network)


class MLPFamily(NetworkFamily):
    """Networks trained by :func:`tasks.ml.network_fit.fit_network` (checkpoints, DDP, CUDA)."""

    kind = "mlp"
    spec_type = MLPSpec
    network_type = CustomerMLP
    config_type = ModelConfig
    model_type = MLPModel

    def build(self, spec: MLPSpec, job: FitJob) -> CustomerMLP:
        """A fresh network for the snapshot's features and normaliser (seeded)."""
        torch.manual_seed(job.settings.seed)
        n = job.normalizer
        return CustomerMLP(
            ModelConfig(
                features=n.features,
                hidden_sizes=spec.hidden_sizes,
                dropout=spec.dropout,
                norm_mean=n.mean,
                norm_std=n.std,
            )
        )

    def cost_hints(
        self, spec: FamilySpec, n_features: int, settings: TrainingSettings
    ) -> CostHints:
        assert isinstance(spec, MLPSpec)
        params = mlp_parameters(n_features, spec.hidden_sizes)
        return CostHints(
            parameters=params,
            train_flops_per_row=6.0 * params * settings.max_epochs,
            score_flops_per_row=2.0 * params,
            network=True,
        )

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
        assert isinstance(spec, MLPSpec) and isinstance(production, MLPModel)
        if production.network.config.hidden_sizes != spec.hidden_sizes:
            return "it has another architecture"
        return production


def network_from_state(state: dict[str, Any]) -> CustomerMLP:
    """The network saved in a checkpoint state."""
    return restore_network(CustomerMLP, ModelConfig, state)  # type: ignore[return-value]


def mlp_parameters(n_features: int, hidden_sizes: list[int]) -> int:
    """Weights + biases of a :class:`CustomerMLP`."""
    total, width = 0, n_features
    for h in [*hidden_sizes, 1]:
        total += width * h + h
        width = h
    return total


def fast_scorer(network: CustomerMLP) -> Scorer | None:
    """A module-call-free forward pass (for one request the ``nn.Module`` calls cost about 3x
    the arithmetic) for a CPU network of Linear/ReLU/Dropout in eval mode, with the bundle's
    calibration applied; None for any other structure."""
    layers: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    relu_after: list[bool] = []
    for module in network.net:
        if isinstance(module, nn.Linear):
            bias = None if module.bias is None else module.bias.detach()
            layers.append((module.weight.detach(), bias))
            relu_after.append(False)
        elif isinstance(module, nn.ReLU) and layers:
            relu_after[-1] = True
        elif not isinstance(module, nn.Dropout):
            return None
    if not layers or network.training or network.norm_mean.device.type != "cpu":
        return None
    mean, std = network.norm_mean.detach(), network.norm_std.detach()
    calibration = network.config.calibration

    @torch.inference_mode()
    def score(x: np.ndarray) -> np.ndarray:
        h = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        h = (torch.sign(h) * torch.log1p(torch.abs(h)) - mean) / std
        for (weight, bias), relu in zip(layers, relu_after, strict=True):
            h = F.linear(h, weight, bias)
            if relu:
                h = torch.relu(h)
        return calibration.probabilities(h.squeeze(-1).float().numpy())

    return score


register_family(MLPFamily())
