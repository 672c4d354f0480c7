"""``hybridflow``: the command line front door.

The CLI is the one entry point above everything else: it imports flows lazily inside each
command, so ``infra`` modules stay free of flow imports at import time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from infra.errors import HybridflowInputError, StoreError
from infra.prefect_env import configure_prefect_defaults

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def _fraction(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {value}")
    return f


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog="hybridflow", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show stack traces on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo-data", help="generate synthetic events with a planted signal")
    demo.add_argument("--customers", type=int, default=20_000)
    demo.add_argument("--days", type=int, default=730)
    demo.add_argument("--out", type=Path, default=Path("data/demo-events"))
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--end-date", type=_date, default=dt.date(2025, 12, 31))
    demo.add_argument("--bad-row-fraction", type=_fraction, default=0.001)

    run = sub.add_parser("run", help="run the whole pipeline in this process")
    _add_run_args(run)
    run.add_argument("--json", action="store_true", help="print one JSON summary line last")

    features = sub.add_parser("features", help="validate + features + preprocess only")
    _add_run_args(features)

    train = sub.add_parser("train", help="train on the snapshot of an earlier features run")
    train.add_argument("--run-id", required=True, help="run id printed by 'hybridflow features'")
    train.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")

    infer = sub.add_parser("infer", help="batch-score the features published for an as-of date")
    infer.add_argument("--as-of", type=_date, required=True)
    infer.add_argument("--model-version", default=None, help="default: production")

    models = sub.add_parser("models", help="the model registry")
    msub = models.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="all versions, oldest first")
    show = msub.add_parser("show", help="one version's manifest")
    show.add_argument("version", nargs="?", default=None, help="default: production")
    promote = msub.add_parser("promote", help="point production at a version")
    promote.add_argument("version")
    promote.add_argument("--reason", default="promoted by hand")
    msub.add_parser("rollback", help="point production back at its previous version")
    return parser


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", required=True, help="Parquet/CSV file or folder of events")
    p.add_argument("--as-of", type=_date, default=None, help="T (default: last event's date)")
    p.add_argument("--horizon-days", type=int, default=None, help="H (default 90)")
    p.add_argument("--max-bad-fraction", type=_fraction, default=None, help="default 0.05")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")


def _cmd_demo_data(args: argparse.Namespace) -> int:
    from tasks.demo_data import DemoDataParams, generate_demo_events

    summary = generate_demo_events(
        DemoDataParams(
            customers=args.customers,
            days=args.days,
            seed=args.seed,
            end_date=args.end_date,
            bad_row_fraction=args.bad_row_fraction,
        ),
        args.out,
    )
    print(
        f"wrote {summary.events:,} events for {summary.customers:,} customers "
        f"({summary.bad_rows} deliberately bad rows) to {summary.path}\n"
        f"events span {summary.start:%Y-%m-%d} .. {summary.end:%Y-%m-%d}"
    )
    return EXIT_OK


def _pipeline_params(args: argparse.Namespace):
    from flows.pipeline import PipelineParams

    return PipelineParams(
        events=str(Path(args.events).expanduser().resolve()),
        as_of=args.as_of,
        horizon_days=args.horizon_days,
        max_bad_fraction=args.max_bad_fraction,
        device=args.device,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from flows.pipeline import pipeline_flow

    summary = pipeline_flow(_pipeline_params(args))
    if args.json:
        print(summary.model_dump_json())
    else:
        print(format_summary(summary))
    return EXIT_OK


def format_summary(summary) -> str:
    """The human summary printed at the end of ``hybridflow run``."""
    m = summary.metrics
    lines = [
        "",
        f"hybridflow run {summary.run_id} completed in {summary.seconds:.0f}s (as_of {summary.as_of}, "
        f"horizon {summary.horizon_days} days)",
        f"  predictions : {summary.predictions_uri}",
        f"  model       : {summary.model_version} "
        f"({'promoted to production' if summary.promoted else 'not promoted'}: {summary.promotion_reason})",
        f"  scored with : {summary.scored_with}",
        f"  test metrics: ROC AUC {m['test_auc']:.4f} | PR AUC {m['test_pr_auc']:.4f} | "
        f"log loss {m['test_logloss']:.4f} | n_train {int(m['n_train'])} | n_test {int(m['n_test'])}",
        f"  rows        : read {summary.rows_read:,} | quarantined {summary.rows_quarantined:,} "
        f"{dict(summary.quarantine_reasons) or ''} | scored {summary.rows_scored:,}",
        f"  quarantine  : {summary.quarantine_uri}",
        "  stages      :",
    ]
    for s in summary.stages:
        lines.append(f"    {s.name:<16} {s.seconds:7.1f}s  {s.device:<5} {s.pool}")
    return "\n".join(lines)


def _cmd_features(args: argparse.Namespace) -> int:
    from prefect import flow

    from flows.features import FeaturesParams, features_flow
    from flows.preprocess import PreprocessParams, preprocess_flow
    from flows.validate import ValidateParams, validate_flow

    params = _pipeline_params(args)

    @flow(name="prepare-data")
    def prepare() -> tuple[str, str]:
        from flows._glue import resolve_run_id

        run_id = resolve_run_id(None)
        validate_flow(
            ValidateParams(events=params.events, run_id=run_id, max_bad_fraction=params.max_bad_fraction)
        )
        features_flow(FeaturesParams(run_id=run_id, as_of=params.as_of, horizon_days=params.horizon_days))
        prepared = preprocess_flow(PreprocessParams(run_id=run_id))
        return run_id, prepared.snapshot_prefix

    run_id, snapshot = prepare()
    print(f"run id: {run_id}\nsnapshot: {snapshot}\nnext: hybridflow train --run-id {run_id}")
    return EXIT_OK


def _cmd_train(args: argparse.Namespace) -> int:
    from flows.train import TrainParams, train_flow

    result = train_flow(TrainParams(run_id=args.run_id, device=args.device))
    print(result.model_dump_json(indent=2))
    return EXIT_OK


def _cmd_infer(args: argparse.Namespace) -> int:
    from flows.batch_inference import InferenceParams, batch_inference_flow

    result = batch_inference_flow(InferenceParams(as_of=args.as_of, model_version=args.model_version))
    print(f"scored {result.rows_scored:,} customers with {result.model_version}: {result.predictions_uri}")
    return EXIT_OK


def _cmd_models(args: argparse.Namespace) -> int:
    from infra.registry import ModelRegistry
    from infra.settings import get_settings
    from infra.store import open_store

    registry = ModelRegistry(open_store(get_settings().store))
    production = registry.alias()
    prod_version = production.version if production else None
    if args.models_command == "list":
        versions = registry.list_versions()
        if not versions:
            print("no model versions yet")
        for m in versions:
            mark = "*" if m.version == prod_version else " "
            auc = m.metrics.get("test_auc")
            print(
                f"{mark} {m.version}  {m.created_at:%Y-%m-%d %H:%M:%S}  "
                f"test_auc={auc:.4f}  parent={m.parent_version or '-'}"
                if auc is not None
                else f"{mark} {m.version}"
            )
        return EXIT_OK
    if args.models_command == "show":
        version = args.version or prod_version
        if version is None:
            raise HybridflowInputError("no production model yet; name a version")
        print(registry.get(version).model_dump_json(indent=2))
        return EXIT_OK
    if args.models_command == "promote":
        record = registry.set_alias(args.version, args.reason, expected_version=prod_version)
        print(f"production -> {record.version} (was {prod_version or 'unset'})")
        return EXIT_OK
    record = registry.rollback()
    print(f"production rolled back -> {record.version} (was {prod_version})")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo-data": _cmd_demo_data,
    "run": _cmd_run,
    "features": _cmd_features,
    "train": _cmd_train,
    "infer": _cmd_infer,
    "models": _cmd_models,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; exit 2 with one line on bad input, 1 on any other failure."""
    args = build_parser().parse_args(argv)
    configure_prefect_defaults()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "py4j", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except HybridflowInputError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"hybridflow: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (StoreError, Exception) as exc:  # noqa: BLE001 - the CLI's last line of defence
        if args.debug:
            traceback.print_exc()
        print(f"hybridflow: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
