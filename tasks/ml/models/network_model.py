"""The torch side of the network families (:mod:`tasks.ml.models.network`): the fitted model the
seam sees and a network rebuilt from a checkpoint state. Imported when a network is fitted,
loaded or scored, never by routing."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from torch import nn

from tasks.ml.models.base import ConfiguredModel
from tasks.ml.models.network import WEIGHTS_FILE
from tasks.ml.network_fit import state_dict_cpu
from tasks.ml.training_loop import network_logits


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
