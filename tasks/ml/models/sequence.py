"""The ``sequence`` family: a small recurrent (GRU) or attention (transformer) encoder over each
customer's last N events, joined with the aggregate features, trained with torch.

Its inputs are the aggregate features followed by every position of the snapshot's sequence
columns (``seq_gap_days[0]`` ... ``seq_channel[N-1]``, :mod:`tasks.data.sequences`), so batch
scoring, the endpoint's snapshot, calibration, the backtest and the gate hand it one matrix like
any other family (:mod:`tasks.ml.model_inputs`). Per event: log-scaled gap to the cutoff and
amount, and embeddings of the event type and of the category and channel codes where present;
padding (event type 0) is masked. The encoder's summary and the normalised aggregate features go
through an MLP head to one logit. It fits through :func:`tasks.ml.network_fit.fit_network`, so
it has the MLP's checkpoints and resume, DDP, bf16 autocast and TF32 on CUDA and
``torch.compile``.

Bundle: ``model.json`` (:class:`SequenceConfig`) and ``model.pt`` (a ``state_dict`` read back
with ``torch.load(weights_only=True)``). Warm start: from a production sequence model of the same
architecture and inputs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from infra.errors import HybridflowInputError
from infra.settings import TrainingSettings
from tasks.definitions.examples import CODE_BUCKETS, OTHER_EVENT_TYPE, split_element
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import CostHints, FamilySpec, FitJob, FittedModel
from tasks.ml.models.network import NetworkFamily
from tasks.ml.models.registry import register_family

if TYPE_CHECKING:
    from torch import nn

    from tasks.ml.models.sequence_network import SequenceNet

GAP, AMOUNT, EVENT_TYPE = "seq_gap_days", "seq_amount", "seq_event_type"
CODED = {"seq_category": 8, "seq_channel": 4}  # embedded code columns and their widths
TYPE_WIDTH = 4
LOG_SCALE = 6.0  # log1p(gap days) and log1p(amount) divided by this: about 0..1.5


class SequenceSpec(FamilySpec):
    """The encoder and head (optimiser settings are ``HYBRIDFLOW_TRAIN__*``)."""

    kind: Literal["sequence"] = "sequence"
    encoder: Literal["gru", "transformer"] = Field(
        default="gru", description="over the events: a GRU, or a transformer encoder"
    )
    width: int = Field(default=32, ge=4, le=1024, description="per-event and summary width")
    layers: int = Field(default=1, ge=1, le=8)
    heads: int = Field(default=2, ge=1, le=16, description="attention heads (transformer)")
    hidden_sizes: list[int] = Field(
        default=[64, 32], description="the head's hidden widths over [features, summary]"
    )
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)


class SequenceConfig(BaseModel):
    """Everything needed to rebuild the network before loading its weights."""

    kind: Literal["sequence"] = "sequence"
    features: list[str] = Field(description="the aggregate features, normalised")
    sequence_columns: list[str] = Field(description="the snapshot's sequence list columns used")
    length: int = Field(ge=1, description="events per customer (N)")
    encoder: Literal["gru", "transformer"]
    width: int
    layers: int
    heads: int
    hidden_sizes: list[int]
    dropout: float
    norm_mean: list[float]
    norm_std: list[float]
    calibration: Calibration = Field(default_factory=Calibration)

    def inputs(self) -> list[str]:
        """The model's input names: the features, then each sequence column's positions."""
        return self.features + [
            f"{column}[{i}]" for column in self.sequence_columns for i in range(self.length)
        ]


class SequenceFamily(NetworkFamily):
    """Sequence networks fitted by :func:`tasks.ml.network_fit.fit_network` on the snapshot's
    features and sequence columns (published when ``HYBRIDFLOW_SEQUENCE_LENGTH`` > 0)."""

    kind = "sequence"
    spec_type = SequenceSpec
    config_type = SequenceConfig
    network_module = "tasks.ml.models.sequence_network"

    def build(self, spec: SequenceSpec, job: FitJob) -> SequenceNet:
        """A fresh network for the snapshot's features, sequences and normaliser (seeded)."""
        inputs = job.data.sequence_inputs()
        if not inputs:
            raise HybridflowInputError(
                "the sequence family needs each customer's last events in the snapshot: set "
                "HYBRIDFLOW_SEQUENCE_LENGTH (e.g. 32) and run the features stage again"
            )
        columns = list(dict.fromkeys(split_element(name)[0] for name in inputs))  # type: ignore[index]
        missing = [c for c in (GAP, AMOUNT, EVENT_TYPE) if c not in columns]
        if missing:
            raise HybridflowInputError(f"the snapshot's sequences lack {missing}")
        used = [c for c in columns if c in (GAP, AMOUNT, EVENT_TYPE, *CODED)]
        import torch

        from tasks.ml.models.sequence_network import SequenceNet

        torch.manual_seed(job.settings.seed)
        n = job.normalizer
        return SequenceNet(
            SequenceConfig(
                features=n.features,
                sequence_columns=used,
                length=len(inputs) // len(columns),
                encoder=spec.encoder,
                width=spec.width,
                layers=spec.layers,
                heads=spec.heads,
                hidden_sizes=spec.hidden_sizes,
                dropout=spec.dropout,
                norm_mean=n.mean,
                norm_std=n.std,
            )
        )

    def job_for(self, network: nn.Module, job: FitJob) -> FitJob:
        return dataclasses.replace(job, data=job.data.with_features(network.config.inputs()))

    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ) -> CostHints:
        assert isinstance(spec, SequenceSpec)
        length = max(1, sequence_length)
        score = sequence_flops_per_row(spec, n_features, length)
        return CostHints(
            parameters=sequence_parameters(spec, n_features),
            train_flops_per_row=3.0 * score * settings.max_epochs,
            score_flops_per_row=score,
            network=True,
        )

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
        from tasks.ml.models.sequence_network import SequenceModel

        assert isinstance(spec, SequenceSpec) and isinstance(production, SequenceModel)
        c = production.network.config
        same = (c.encoder, c.width, c.layers, c.heads, c.hidden_sizes) == (
            spec.encoder,
            spec.width,
            spec.layers,
            spec.heads,
            spec.hidden_sizes,
        )
        return production if same else "it has another architecture"


def _encoder_parameters(spec: SequenceSpec) -> int:
    w = spec.width
    if spec.encoder == "gru":
        return spec.layers * 3 * (2 * w * w + 2 * w)
    per_layer = 4 * (w * w + w) + 2 * (2 * w * w) + 3 * w + 4 * w  # attention, FFN, norms
    return spec.layers * per_layer


def _head_parameters(spec: SequenceSpec, n_features: int) -> int:
    total, size = 0, n_features + spec.width
    for h in [*spec.hidden_sizes, 1]:
        total += size * h + h
        size = h
    return total


def sequence_parameters(spec: SequenceSpec, n_features: int) -> int:
    """Weights of a :class:`SequenceNet` (category and channel embeddings included)."""
    event_width = 2 + TYPE_WIDTH + sum(CODED.values())
    embeddings = (OTHER_EVENT_TYPE + 1) * TYPE_WIDTH + sum(CODE_BUCKETS * w for w in CODED.values())
    event = event_width * spec.width + spec.width
    return embeddings + event + _encoder_parameters(spec) + _head_parameters(spec, n_features)


def sequence_flops_per_row(spec: SequenceSpec, n_features: int, length: int) -> float:
    """Forward FLOPs for one customer: every event through the event layer and the encoder (a
    transformer also attends between every pair), then the head: it grows with N x width."""
    w = spec.width
    event_width = 2 + TYPE_WIDTH + sum(CODED.values())
    per_event = 2.0 * (event_width * w + _encoder_parameters(spec))
    attention = 4.0 * spec.layers * length * w if spec.encoder == "transformer" else 0.0
    return length * (per_event + attention) + 2.0 * _head_parameters(spec, n_features)


NETWORK_NAMES = ("SequenceNet", "SequenceModel", "network_from_state")


def __getattr__(name: str) -> Any:
    """The network's names (:data:`NETWORK_NAMES`, in :mod:`tasks.ml.models.sequence_network`:
    torch), imported on first use."""
    if name in NETWORK_NAMES:
        from tasks.ml.models import sequence_network

        return getattr(sequence_network, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_family(SequenceFamily())
