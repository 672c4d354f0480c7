"""The ``mlp`` family's network (torch): the module, the fitted model the seam sees and its fast
single-request scorer. Imported when a network is built, fitted, loaded or scored; the family
(spec, cost hints) is :mod:`tasks.ml.models.mlp`, which also re-exports these names."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tasks.ml.models.base import Scorer
from tasks.ml.models.mlp import ModelConfig
from tasks.ml.models.network_model import NetworkModel, restore_network


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


def network_from_state(state: dict[str, Any]) -> CustomerMLP:
    """The network saved in a checkpoint state."""
    return restore_network(CustomerMLP, ModelConfig, state)  # type: ignore[return-value]


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


NETWORK_TYPE, MODEL_TYPE = CustomerMLP, MLPModel
