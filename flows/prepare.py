"""Flow ``prepare-data`` (cpu-pool): validate -> features -> preprocess as one dispatch unit
(one process and one Spark session instead of three)."""

from __future__ import annotations

from pydantic import BaseModel

from flows.context import resolve_run_id
from flows.dag import PREPARE_UNIT, PREPROCESS, stage_result
from flows.executors import run_in_process
from flows.params import StageParams, resolve
from flows.params_flow import params_flow


class PrepareResult(BaseModel):
    """The run id whose manifests hold the outputs, and the snapshot."""

    run_id: str
    snapshot_prefix: str


@params_flow(name=PREPARE_UNIT.flow_name)
def prepare_flow(params: StageParams) -> PrepareResult:
    """Everything the train stage needs, published in the store under ``runs/<run_id>/``."""
    run_id = resolve_run_id(params.run_id)
    run_in_process(params.model_copy(update={"run_id": run_id}), units=(PREPARE_UNIT,))
    prepared = stage_result(resolve(params).store, run_id, PREPROCESS)
    return PrepareResult(run_id=run_id, snapshot_prefix=prepared.snapshot_prefix)
