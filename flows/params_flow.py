"""Deployed flows take one parameter, ``params`` (a pydantic model). A Prefect client that sets
one of its fields at the top level (``prefect deployment run pipeline/pipeline --param
events=s3://b/events``, ``run_deployment(parameters={"events": ...})``) would fail at the run's
start with Prefect's ``SignatureMismatchError``; such fields are folded into ``params`` instead
(over the deployment's defaults, which the server merged in), and any other top-level name is
refused naming the form to use."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Collection
from typing import Any

from prefect import Flow
from prefect.exceptions import ParameterTypeError
from pydantic import BaseModel

PARAMS = "params"


def fold_flat_parameters(
    parameters: dict[str, Any], fields: Collection[str], flow_name: str
) -> dict[str, Any]:
    """``parameters`` with each top-level name that is a field of ``params`` moved into it (a
    top-level value wins over the one in ``params``: the deployment's default is there); a
    ParameterTypeError naming any other top-level name and ``--param params='{...}'``."""
    flat = {k: v for k, v in parameters.items() if k != PARAMS}
    if not flat:
        return parameters
    unknown = sorted(k for k in flat if k not in fields)
    if unknown:
        example = json.dumps({"events": "s3://bucket/events", "horizon_days": 30})
        raise ParameterTypeError(
            f"flow {flow_name!r} takes one parameter, params (an object): "
            f"{', '.join(repr(k) for k in unknown)} is not one of its fields "
            f"({', '.join(sorted(fields))}); give them inside it, e.g. "
            f"--param params='{example}'"
        )
    nested = parameters.get(PARAMS)
    if nested is not None and not isinstance(nested, dict):
        nested = nested.model_dump() if isinstance(nested, BaseModel) else nested
    return {PARAMS: {**(nested or {}), **flat}}


class ParamsFlow(Flow):
    """A Prefect flow whose one parameter is ``params``: top-level fields of it folded in
    (:func:`fold_flat_parameters`) before Prefect validates the parameters."""

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        if set(parameters) - {PARAMS}:  # only then is the model looked at
            parameters = fold_flat_parameters(parameters, self._params_fields(), self.name)
        return super().validate_parameters(parameters)

    def _params_fields(self) -> list[str]:
        """The fields of the ``params`` model (none when it is not a pydantic model)."""
        model = typing.get_type_hints(self.fn).get(PARAMS)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return list(model.model_fields)
        return []


def params_flow(**options: Any) -> Callable[[Callable[..., Any]], ParamsFlow]:
    """``@flow(**options)`` for a function of one ``params`` model, as a :class:`ParamsFlow`."""

    def decorate(fn: Callable[..., Any]) -> ParamsFlow:
        return ParamsFlow(fn, **options)

    return decorate
