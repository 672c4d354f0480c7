"""The ``mlp`` family: a feed-forward network on the normalised features, trained with torch.

Bundle: ``model.json`` (:class:`ModelConfig`: the architecture, feature names, normaliser and
calibration) and ``model.pt`` (a ``state_dict`` of plain tensors, read back with
``torch.load(weights_only=True)``). Bundles written before families existed have the same two
files and no ``kind``; they load here unchanged. Warm start: from a production MLP of the same
architecture and features, at ``warm_start_lr_factor`` times the learning rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from infra.settings import TrainingSettings
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import CostHints, FamilySpec, FitJob, FittedModel
from tasks.ml.models.network import WEIGHTS_FILE, NetworkFamily
from tasks.ml.models.registry import register_family

if TYPE_CHECKING:
    from tasks.ml.models.mlp_network import CustomerMLP

__all__ = ["WEIGHTS_FILE", "MLPFamily", "MLPSpec", "ModelConfig"]  # and NETWORK_NAMES, lazily


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


class MLPFamily(NetworkFamily):
    """Networks trained by :func:`tasks.ml.network_fit.fit_network` (checkpoints, DDP, CUDA)."""

    kind = "mlp"
    spec_type = MLPSpec
    config_type = ModelConfig
    network_module = "tasks.ml.models.mlp_network"

    def build(self, spec: MLPSpec, job: FitJob) -> CustomerMLP:
        """A fresh network for the snapshot's features and normaliser (seeded)."""
        import torch

        from tasks.ml.models.mlp_network import CustomerMLP

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
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
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
        from tasks.ml.models.mlp_network import MLPModel

        assert isinstance(spec, MLPSpec) and isinstance(production, MLPModel)
        if production.network.config.hidden_sizes != spec.hidden_sizes:
            return "it has another architecture"
        return production


def mlp_parameters(n_features: int, hidden_sizes: list[int]) -> int:
    """Weights + biases of a :class:`CustomerMLP`."""
    total, width = 0, n_features
    for h in [*hidden_sizes, 1]:
        total += width * h + h
        width = h
    return total


NETWORK_NAMES = ("CustomerMLP", "MLPModel", "fast_scorer", "network_from_state")


def __getattr__(name: str) -> Any:
    """The network's names (:data:`NETWORK_NAMES`, in :mod:`tasks.ml.models.mlp_network`:
    torch), imported on first use."""
    if name in NETWORK_NAMES:
        from tasks.ml.models import mlp_network

        return getattr(mlp_network, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_family(MLPFamily())
