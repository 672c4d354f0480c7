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
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from torch import nn

from infra.errors import HybridflowInputError
from infra.settings import TrainingSettings
from tasks.definitions.examples import CODE_BUCKETS, OTHER_EVENT_TYPE, split_element
from tasks.ml.calibration import Calibration
from tasks.ml.models.base import CostHints, FamilySpec, FitJob, FittedModel
from tasks.ml.models.network import NetworkFamily, NetworkModel, restore_network
from tasks.ml.models.registry import register_family

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


class SequenceNet(nn.Module):
    """Raw inputs (:meth:`SequenceConfig.inputs`) in, purchase logit out."""

    def __init__(self, config: SequenceConfig) -> None:
        super().__init__()
        self.config = config
        n, width = len(config.features), config.width
        self.register_buffer("norm_mean", torch.tensor(config.norm_mean, dtype=torch.float32))
        self.register_buffer("norm_std", torch.tensor(config.norm_std, dtype=torch.float32))
        columns = config.sequence_columns
        self.slot = {c: i for i, c in enumerate(columns)}
        self.type_embedding = nn.Embedding(OTHER_EVENT_TYPE + 1, TYPE_WIDTH, padding_idx=0)
        self.code_embeddings = nn.ModuleDict(
            {
                c: nn.Embedding(CODE_BUCKETS, w, padding_idx=0)
                for c, w in CODED.items()
                if c in columns
            }
        )
        event_width = 2 + TYPE_WIDTH + sum(CODED[c] for c in self.code_embeddings)
        self.event = nn.Linear(event_width, width)
        if config.encoder == "gru":
            self.gru = nn.GRU(width, width, num_layers=config.layers, batch_first=True)
        else:
            self.position = nn.Parameter(torch.zeros(config.length, width))
            layer = nn.TransformerEncoderLayer(
                width, config.heads, 2 * width, config.dropout, batch_first=True
            )
            self.transformer = nn.TransformerEncoder(
                layer, config.layers, enable_nested_tensor=False
            )
        layers: list[nn.Module] = []
        size = n + width
        for h in config.hidden_sizes:
            layers += [nn.Linear(size, h), nn.ReLU(), nn.Dropout(config.dropout)]
            size = h
        layers.append(nn.Linear(size, 1))
        self.head = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length = len(self.config.features), self.config.length
        raw = x[:, :n]
        features = (torch.sign(raw) * torch.log1p(torch.abs(raw)) - self.norm_mean) / self.norm_std
        seq = x[:, n:].reshape(x.shape[0], len(self.slot), length)
        kinds = seq[:, self.slot[EVENT_TYPE]].round().long().clamp(0, OTHER_EVENT_TYPE)
        real = kinds > 0  # padding has event type 0
        parts = [
            torch.log1p(seq[:, self.slot[GAP]].clamp(min=0.0)) / LOG_SCALE,
            torch.log1p(seq[:, self.slot[AMOUNT]].clamp(min=0.0)) / LOG_SCALE,
        ]
        events = [torch.stack(parts, dim=-1), self.type_embedding(kinds)]
        for column, embedding in self.code_embeddings.items():
            codes = seq[:, self.slot[column]].round().long().clamp(0, CODE_BUCKETS - 1)
            events.append(embedding(codes))
        steps = self.event(torch.cat(events, dim=-1)) * real.unsqueeze(-1)
        summary = self._encode(steps, real)
        return self.head(torch.cat([features, summary.to(features.dtype)], dim=-1)).squeeze(-1)

    def _encode(self, steps: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The events (most recent first, padding after) summarised in one vector each."""
        if self.config.encoder == "gru":
            # oldest to newest, the padding first: the last state has read the newest event
            _, state = self.gru(torch.flip(steps, dims=[1]))
            return state[-1]
        # a row without events attends to its first (zero) slot rather than to nothing
        keep = real.clone()
        keep[:, 0] = True
        encoded = self.transformer(steps + self.position, src_key_padding_mask=~keep)
        weights = real.unsqueeze(-1).to(encoded.dtype)
        return (encoded * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class SequenceModel(NetworkModel):
    """A trained :class:`SequenceNet` (in eval mode) as the seam sees it."""

    kind = "sequence"
    network: SequenceNet

    @property
    def features(self) -> list[str]:
        return self.network.config.inputs()

    def describe(self) -> str:
        c = self.network.config
        return (
            f"sequence {c.encoder} {c.layers}x{c.width} over the last {c.length} events + "
            f"{len(c.features)} features, {self.n_parameters:,} parameters"
        )


class SequenceFamily(NetworkFamily):
    """Sequence networks fitted by :func:`tasks.ml.network_fit.fit_network` on the snapshot's
    features and sequence columns (published when ``HYBRIDFLOW_SEQUENCE_LENGTH`` > 0)."""

    kind = "sequence"
    spec_type = SequenceSpec
    network_type = SequenceNet
    config_type = SequenceConfig
    model_type = SequenceModel

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
        self, spec: FamilySpec, n_features: int, settings: TrainingSettings
    ) -> CostHints:
        assert isinstance(spec, SequenceSpec)
        length = max(1, settings_sequence_length())
        score = sequence_flops_per_row(spec, n_features, length)
        return CostHints(
            parameters=sequence_parameters(spec, n_features),
            train_flops_per_row=3.0 * score * settings.max_epochs,
            score_flops_per_row=score,
            network=True,
        )

    def warm_start(self, production: FittedModel, spec: FamilySpec) -> FittedModel | str:
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


def network_from_state(state: dict[str, Any]) -> SequenceNet:
    """The network saved in a checkpoint state."""
    return restore_network(SequenceNet, SequenceConfig, state)  # type: ignore[return-value]


def settings_sequence_length() -> int:
    """The events per customer the features stage publishes (``HYBRIDFLOW_SEQUENCE_LENGTH``)."""
    from infra.settings import get_settings

    return get_settings().sequence_length


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


register_family(SequenceFamily())
