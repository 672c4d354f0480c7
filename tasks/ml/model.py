"""The model and its on-disk format, shared by training, batch inference and serving.

A model bundle is two files: ``model.json`` (architecture, feature names, normaliser and the
calibration fitted on held-out rows) and ``model.pt`` (a ``state_dict`` saved with ``torch.save``). Loading verifies both files' sha256
against the registry manifest first and then uses ``torch.load(weights_only=True)``: no pickle
of arbitrary objects is ever executed.
"""

from __future__ import annotations

import io
import json

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from infra.errors import ChecksumMismatchError
from infra.store import sha256_bytes
from tasks.ml.calibration import Calibration

WEIGHTS_FILE = "model.pt"
CONFIG_FILE = "model.json"


class Normalizer(BaseModel):
    """Per-feature mean/std of ``signed_log1p(x)`` on the train split."""

    features: list[str]
    mean: list[float]
    std: list[float]


class ModelConfig(BaseModel):
    """Everything needed to rebuild the network before loading its weights."""

    features: list[str]
    hidden_sizes: list[int]
    dropout: float
    norm_mean: list[float]
    norm_std: list[float]
    calibration: Calibration = Field(
        default_factory=Calibration, description="logit -> probability (identity if absent)"
    )


class CustomerMLP(nn.Module):
    """Raw features in, purchase logit out; the train-fitted normaliser is part of the model, and
    the calibration (``config.calibration``) turns the logit into the probability it serves."""

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


def bundle_bytes(model: CustomerMLP) -> dict[str, bytes]:
    """The model as the two files of a bundle."""
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
    return {
        CONFIG_FILE: model.config.model_dump_json(indent=2).encode(),
        WEIGHTS_FILE: buf.getvalue(),
    }


def load_bundle(files: dict[str, bytes], sha256: dict[str, str]) -> CustomerMLP:
    """Rebuild a model from bundle bytes after checking every file against ``sha256``."""
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if name not in files or name not in sha256:
            raise ChecksumMismatchError(f"model bundle lacks {name} or its checksum")
        actual = sha256_bytes(files[name])
        if actual != sha256[name]:
            raise ChecksumMismatchError(
                f"{name}: sha256 {actual[:12]}... does not match manifest {sha256[name][:12]}..."
            )
    config = ModelConfig.model_validate(json.loads(files[CONFIG_FILE]))
    state = torch.load(io.BytesIO(files[WEIGHTS_FILE]), map_location="cpu", weights_only=True)
    model = CustomerMLP(config)
    model.load_state_dict(state)
    model.eval()
    return model


def with_calibration(model: CustomerMLP, calibration: Calibration) -> CustomerMLP:
    """Set ``calibration`` in ``model``'s config (in place) and return the model."""
    model.config = model.config.model_copy(update={"calibration": calibration})
    return model


@torch.inference_mode()
def predict_logits(
    model: CustomerMLP, features: np.ndarray, batch_size: int = 65_536
) -> np.ndarray:
    """Raw logits (float64) for a 2-D array of raw features in ``config.features`` order."""
    device = next(model.parameters()).device
    out = np.empty(len(features), dtype=np.float64)
    for start in range(0, len(features), batch_size):
        chunk = torch.as_tensor(
            np.ascontiguousarray(features[start : start + batch_size], dtype=np.float32),
            device=device,
        )
        out[start : start + len(chunk)] = model(chunk).float().cpu().numpy()
    return out


def predict_proba(
    model: CustomerMLP, features: np.ndarray, batch_size: int = 65_536, *, calibrated: bool = True
) -> np.ndarray:
    """Purchase probabilities (float64) for raw features in ``config.features`` order: the
    model's calibration applied to its logits (``calibrated=False``: the raw sigmoid)."""
    logits = predict_logits(model, features, batch_size)
    calibration = model.config.calibration if calibrated else Calibration()
    return calibration.probabilities(logits)
