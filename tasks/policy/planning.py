"""Before a run: the routing plan for the pipeline on a set of events (nothing is run)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.errors import HybridflowInputError
from infra.routing.planner import (
    ContenderCost,
    ModelCost,
    RoutingPlan,
    count_event_rows,
    pipeline_workloads,
    plan_run,
)
from infra.routing.profiles import read_profiles
from infra.routing.router import StageWork, parse_duration
from infra.settings import HybridflowSettings
from infra.storage.store import ObjectStore
from tasks.data.input_formats import CSV_SUFFIXES, list_event_files
from tasks.definitions.contract import OPTIONAL_DEFAULTS
from tasks.definitions.feature_specs import feature_names
from tasks.ml.models import family_specs, get_family
from tasks.reporting.records import contender_stage


def plan_pipeline(
    events: str,
    settings: HybridflowSettings,
    store: ObjectStore,
    *,
    deadline: str | None = None,
    pinned: dict[str, str] | None = None,
    tight_budget: bool = False,
    stages: Sequence[StageWork],
    families: list[str] | None = None,
) -> RoutingPlan:
    """The routing plan for running the pipeline on ``events``: the input's size (rows from the
    files' metadata), the contending families' cost hints (together for the train stage, one
    by one for each family's contender unit), the measured profiles and the prices."""
    files = list_event_files(Path(events).expanduser())
    try:
        n_features = len(feature_names(set(OPTIONAL_DEFAULTS)))
        kinds = families or settings.train.families
        workloads = pipeline_workloads(
            count_event_rows(files, CSV_SUFFIXES),
            model_cost(kinds, n_features, settings),
            stages,
            pinned=pinned,
            tight_budget=tight_budget,
            contenders=contender_costs(kinds, n_features, settings),
        )
        return plan_run(
            workloads,
            settings.priced_pools(),
            read_profiles(store),
            parse_duration(deadline) if deadline else None,
        )
    except ValueError as exc:
        raise HybridflowInputError(str(exc)) from None


def contender_costs(
    families: list[str], n_features: int, settings: HybridflowSettings
) -> list[ContenderCost]:
    """Each contending family's fit, from its cost hints (on up to one example per customer
    and training origin), as the workload of its contender unit ``contender-<family>``."""
    costs = []
    for spec in family_specs(families, settings.train.specs):
        hints = get_family(spec.kind).cost_hints(
            spec, n_features, settings.train, settings.sequence_length
        )
        costs.append(
            ContenderCost(
                stage=contender_stage(spec.kind),
                parameters=hints.parameters,
                train_flops_per_row=hints.train_flops_per_row * settings.training_origins,
                network=hints.network,
            )
        )
    return costs


def model_cost(families: list[str], n_features: int, settings: HybridflowSettings) -> ModelCost:
    """The contenders' cost hints added up for the router: every contender is fitted (on up to
    one example per customer and training origin), the largest one may be the model that
    scores."""
    hints = [
        get_family(spec.kind).cost_hints(spec, n_features, settings.train, settings.sequence_length)
        for spec in family_specs(families, settings.train.specs)
    ]
    return ModelCost(
        parameters=max(h.parameters for h in hints),
        train_flops_per_row=sum(h.train_flops_per_row for h in hints) * settings.training_origins,
        score_flops_per_row=max(h.score_flops_per_row for h in hints),
    )
