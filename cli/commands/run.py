"""``hybridflow run``: the whole pipeline in this process (embedded mode)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cli.args import (
    EXIT_OK,
    add_families_arg,
    add_run_args,
    check_events_and_start_engines,
    run_inputs,
)
from cli.commands.plan import parse_pins
from infra import startup
from infra.prefect_runtime.api import prefect_api
from infra.warm_imports import start_warm_imports

if TYPE_CHECKING:
    from flows.pipeline import PipelineParams
    from tasks.reporting.records import PipelineSummary, StageReport


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand."""
    p = sub.add_parser("run", help="run the whole pipeline in this process")
    add_run_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON summary line last")
    p.add_argument(
        "--fresh", action="store_true", help="train from step 0 (ignore earlier checkpoints)"
    )
    p.add_argument("--deadline", default=None, help="pipeline deadline for the router, e.g. 2h")
    p.add_argument(
        "--pin", action="append", default=[], metavar="STAGE=POOL", help="force a stage's pool"
    )
    p.add_argument("--tight-budget", action="store_true", help="CPU first where rules decide")
    add_families_arg(p)
    p.set_defaults(handler=run)


def pipeline_params(args: argparse.Namespace) -> PipelineParams:
    """PipelineParams from the run options."""
    from flows.pipeline import PipelineParams

    return PipelineParams.model_validate(
        run_inputs(args)
        | {
            "fresh": args.fresh,
            "deadline": args.deadline,
            "pinned_pools": parse_pins(args.pin),
            "tight_budget": args.tight_budget,
            "families": args.families,
        }
    )


def run(args: argparse.Namespace) -> int:
    """Run the pipeline flow and print its summary."""
    spark_stages = check_events_and_start_engines(args)
    from flows.pipeline import pipeline_flow

    if spark_stages:
        # what the train stage imports, in the background while the JVM does the CPU stages
        # (not before the first stage: on a small box it would compete with the way there);
        # not beside stages in this process: DuckDB's threads and the GIL make them slower by
        # what the thread's imports cost (infra.warm_imports)
        startup.at_first_stage(start_warm_imports)
    with prefect_api():
        summary = pipeline_flow(pipeline_params(args))
    print(summary.model_dump_json() if args.json else format_summary(summary))
    return EXIT_OK


def drift_line(drift: dict) -> str:
    """The drift check and the refresh decision in one line (``drift`` entry of the summary)."""
    if not drift:
        return "-"
    refresh = drift.get("refresh", {})
    measured = ", ".join(f"{k} {v:.3f}" for k, v in drift.get("drifted", {}).items())
    found = f"{drift['status']}" + (f" ({measured})" if measured else "")
    if drift["status"] == "error":
        found = f"check failed: {drift.get('error')}"
    return f"{found}; refresh {refresh.get('reason', '-')}: {refresh.get('explanation', '')}"


def format_summary(summary: PipelineSummary) -> str:
    """The human summary printed at the end of ``hybridflow run``."""
    m = summary.metrics
    promoted = "promoted to production" if summary.promoted else "not promoted"
    reasons = dict(summary.quarantine_reasons) or ""
    lines = [
        "",
        f"hybridflow run {summary.run_id} completed in {summary.seconds:.0f}s "
        f"(as_of {summary.as_of}, horizon {summary.horizon_days} days)",
        f"  predictions : {summary.predictions_uri}",
        f"  model       : {summary.model_version} ({promoted}: {summary.promotion_reason})",
        f"  scored with : {summary.scored_with}",
        f"  test metrics: ROC AUC {m['test_auc']:.4f} | PR AUC {m['test_pr_auc']:.4f} | "
        f"log loss {m['test_logloss']:.4f} | n_train {int(m['n_train'])}"
        f"{origins_note(m.get('training_origins') or [])} | n_test {int(m['n_test'])}",
        f"  backtest    : {format_backtest(m.get('backtest') or {})}",
        *format_leaderboard(m.get("leaderboard") or [], m.get("champion") or ""),
        f"  rows        : read {summary.rows_read:,} | quarantined {summary.rows_quarantined:,} "
        f"{reasons} | scored {summary.rows_scored:,}",
        f"  quarantine  : {summary.quarantine_uri}",
        f"  drift       : {drift_line(summary.drift)}",
        f"  startup     : {startup_line(summary.startup_seconds, summary.startup)}",
        "  stages      :",
        *stage_lines(summary.stages),
    ]
    return "\n".join(lines)


def stage_lines(stages: list[StageReport]) -> list[str]:
    """One line per stage, the seconds aligned however long the stages' names are."""
    width = max([16, *(len(s.name) for s in stages)])
    lines = []
    for s in stages:
        cached = "  (cached)" if s.cached else ""
        engine = f"  {s.engine}: {s.engine_reason}" if s.engine else ""
        lines.append(
            f"    {s.name:<{width}} {s.seconds:7.1f}s  {s.device:<5} {s.pool}{cached}{engine}"
        )
    return lines


def startup_line(seconds: float | None, steps: dict[str, float]) -> str:
    """The run's fixed cost before its first stage, and its steps."""
    if seconds is None:
        return "-"
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.1f}s" for k, v in steps.items())
    return f"{seconds:.1f}s before the first stage ({parts})"


def origins_note(origins: list[str]) -> str:
    """`` (4 origins)`` after the training examples' count when they come from several."""
    return f" ({len(origins)} origins)" if len(origins) > 1 else ""


def format_leaderboard(rows: list[dict], why: str) -> list[str]:
    """The contenders, best first (``*`` marks the champion), under the run's model line."""
    if not rows:
        return []
    basis = rows[0].get("basis", "backtest")
    header = (
        f"{'family':<10} {'AUC':>6}  {'log loss':>8}  {'ECE':>6}  {'mean/rate':>11}  "
        f"{'size':>9}  {'fit':>7}  device pool"
    )
    out = [f"  champion    : {why}", f"  contenders  : {header}  ({basis}, calibrated)"]
    for r in rows:
        mark = "*" if r.get("champion") else " "
        rate = f"{r['mean_score']:.3f}/{r['positive_rate']:.3f}"
        out.append(
            f"              {mark}{r['family']:<9} {r['auc']:.4f}  {r['logloss']:>8.4f}  "
            f"{r['ece']:.4f}  {rate:>11}  {r['size']:>9,}  {r['train_seconds']:>6.1f}s  "
            f"{r['device']:<6} {r['pool']}"
        )
    return out


def format_backtest(backtest: dict) -> str:
    """One line: the calibrated model and the baseline out of time, or why there is none."""
    if backtest.get("status") != "done":
        return f"skipped ({backtest.get('reason', 'no backtest')})"
    model, baseline = backtest["model"], backtest["baseline"]
    return (
        f"ROC AUC {model['auc']:.4f} | log loss {model['logloss']:.4f} "
        f"(baseline {baseline['logloss']:.4f}) | ECE {model['ece']:.4f} | "
        f"mean score {model['mean_score']:.3f} vs rate {model['positive_rate']:.3f}"
    )
