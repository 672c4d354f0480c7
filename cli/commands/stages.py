"""``hybridflow features|train|infer``: single stages, run in this process."""

from __future__ import annotations

import argparse

from cli.args import (
    EXIT_OK,
    add_families_arg,
    add_run_args,
    check_events_and_start_engines,
    iso_date,
    run_id,
    run_inputs,
)
from infra.prefect_runtime.api import prefect_api, start_temporary_api


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommands."""
    features = sub.add_parser("features", help="validate + features + preprocess only")
    add_run_args(features)
    features.set_defaults(handler=run_features)

    train = sub.add_parser("train", help="train on the snapshot of an earlier features run")
    train.add_argument(
        "--run-id", type=run_id, required=True, help="run id printed by 'hybridflow features'"
    )
    train.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    train.add_argument(
        "--fresh", action="store_true", help="ignore checkpoints of this training and start over"
    )
    train.add_argument(
        "--scratch", action="store_true", help="do not warm-start from the production model"
    )
    add_families_arg(train)
    train.set_defaults(handler=run_train)

    infer = sub.add_parser(
        "infer",
        help="batch-score the features published for an as-of date (replaces its predictions)",
    )
    infer.add_argument("--as-of", type=iso_date, required=True)
    infer.add_argument(
        "--model-version", default=None, help="any registry version (default: production)"
    )
    infer.set_defaults(handler=run_infer)


def run_features(args: argparse.Namespace) -> int:
    """Validate, build features and publish the training snapshot; print the run id."""
    check_events_and_start_engines(args)
    from flows.params import StageParams
    from flows.prepare import prepare_flow

    with prefect_api():
        result = prepare_flow(StageParams.model_validate(run_inputs(args)))
    print(
        f"run id: {result.run_id}\nsnapshot: {result.snapshot_prefix}\n"
        f"next: hybridflow train --run-id {result.run_id}"
    )
    return EXIT_OK


def run_train(args: argparse.Namespace) -> int:
    """Train on an earlier run's snapshot (refused at once when the store has no such run)."""
    from infra.settings import get_settings
    from infra.storage.store import open_store
    from tasks.reporting.records import require_stage_manifest

    require_stage_manifest(open_store(get_settings().store), args.run_id, "preprocess")
    start_temporary_api(get_settings())
    from flows.params import StageParams
    from flows.train import train_flow

    with prefect_api():
        result = train_flow(
            StageParams(
                run_id=args.run_id,
                device=args.device,
                fresh=args.fresh,
                scratch=args.scratch,
                families=args.families,
            )
        )
    print(result.model_dump_json(indent=2))
    return EXIT_OK


def run_infer(args: argparse.Namespace) -> int:
    """Batch-score with production or a given version."""
    from infra.settings import get_settings

    start_temporary_api(get_settings())
    from flows.batch_inference import batch_inference_flow
    from flows.params import StageParams

    with prefect_api():
        result = batch_inference_flow(
            StageParams(as_of=args.as_of, model_version=args.model_version)
        )
    seconds = result.report.seconds
    print(
        f"scored {result.rows_scored:,} customers with {result.model_version} in {seconds:.1f}s "
        f"({result.rows_scored / max(seconds, 1e-9):,.0f} rows/s): {result.predictions_uri}"
    )
    return EXIT_OK
