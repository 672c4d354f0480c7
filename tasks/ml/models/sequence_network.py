"""The ``sequence`` family's network (torch): the encoder module and the fitted model the seam
sees. Imported when a network is built, fitted, loaded or scored; the family (spec, cost hints)
is :mod:`tasks.ml.models.sequence`, which also re-exports these names."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tasks.definitions.examples import CODE_BUCKETS, OTHER_EVENT_TYPE
from tasks.ml.models.network_model import NetworkModel, restore_network
from tasks.ml.models.sequence import (
    AMOUNT,
    CODED,
    EVENT_TYPE,
    GAP,
    LOG_SCALE,
    TYPE_WIDTH,
    SequenceConfig,
)


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


def network_from_state(state: dict[str, Any]) -> SequenceNet:
    """The network saved in a checkpoint state."""
    return restore_network(SequenceNet, SequenceConfig, state)  # type: ignore[return-value]


NETWORK_TYPE, MODEL_TYPE = SequenceNet, SequenceModel
