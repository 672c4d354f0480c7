"""``python -m tasks.stages.train_process``: the train stage as a process (torchrun DDP, or alone).

    torchrun --standalone --nproc_per_node=2 -m tasks.stages.train_process --run-id RUN --store s3://b/p

Reads the run's ``features`` and ``preprocess`` stage manifests from the store (:data:`READS`, the
train stage's ``reads`` in flows/dag.py, which a test holds equal), trains (resuming
the newest valid checkpoint of the same training id) and, on rank 0, registers, applies the gate
and writes the result as JSON to ``--result-file`` (with ``--contender FAMILY``: fits that
family only and keeps it in the store for the run's train stage). Exit codes: 0 done, 3 stopped on purpose by
``--stop-after-steps`` (resume by running again), 1 failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pydantic import BaseModel

from infra.errors import HybridflowInputError, StoreError
from infra.settings import HybridflowSettings, get_settings
from infra.storage.store import ObjectStore, open_store
from tasks.ml.ddp import shutdown_distributed
from tasks.policy.contending import ContenderResult, TrainingInterrupted, TrainingOptions
from tasks.reporting.records import FeaturesResult, PreprocessResult, read_stage_manifest
from tasks.stages.contenders import fit_contender
from tasks.stages.train import TrainStageOutput, train_stage

EXIT_INTERRUPTED = 3
# a process given only a run id reads what the train stage reads (flows/dag.py: TRAIN.reads)
READS: dict[str, type[BaseModel]] = {"features": FeaturesResult, "preprocess": PreprocessResult}


def read_inputs(store: ObjectStore, run_id: str) -> tuple[FeaturesResult, PreprocessResult]:
    """The results :data:`READS` names, of run ``run_id`` (what the train stage and a contender
    unit read)."""
    features, prepared = (read_stage_manifest(store, run_id, n, m) for n, m in READS.items())
    assert isinstance(features, FeaturesResult) and isinstance(prepared, PreprocessResult)
    return features, prepared


def train_for_run(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    *,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> TrainStageOutput | None:
    """The train stage of run ``run_id`` in this process (this rank's part; None on ranks other
    than 0), on the results :data:`READS` names."""
    features, prepared = read_inputs(store, run_id)
    return train_stage(
        store,
        prepared,
        settings,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        device_preference=device_preference,
        options=(options or TrainingOptions()).of_run(features),
        run_id=run_id,
    )


def contender_for_run(
    store: ObjectStore,
    run_id: str,
    settings: HybridflowSettings,
    family: str,
    *,
    device_preference: str = "auto",
    options: TrainingOptions | None = None,
) -> ContenderResult | None:
    """The contender unit of ``family`` in run ``run_id`` in this process (this rank's part;
    None on ranks other than 0), on the results :data:`READS` names."""
    features, prepared = read_inputs(store, run_id)
    return fit_contender(
        store,
        run_id,
        settings,
        family,
        features=features,
        preprocess=prepared,
        device_preference=device_preference,
        options=options,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the entry point."""
    p = argparse.ArgumentParser(
        prog="python -m tasks.stages.train_process", description=__doc__.split("\n")[0]
    )
    p.add_argument("--run-id", required=True, help="pipeline run whose snapshot to train on")
    p.add_argument("--store", default=None, help="default: HYBRIDFLOW_STORE")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--fresh", action="store_true", help="drop this training's checkpoints first")
    p.add_argument("--scratch", action="store_true", help="never warm-start from production")
    p.add_argument(
        "--families", default=None, help="comma-separated model families to fit (default: setting)"
    )
    p.add_argument(
        "--contender",
        default=None,
        help="fit only this family as the run's contender unit and keep it in the store",
    )
    p.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        help="preemptible workers: stop after N steps with a checkpoint (exit 3)",
    )
    p.add_argument("--result-file", type=Path, default=None, help="rank 0 writes its result here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the train stage in this process (one rank of a torchrun job, or alone)."""
    args = parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s",
    )
    for noisy in ("botocore", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = get_settings()
    store = open_store(args.store or settings.store)
    options = TrainingOptions(
        fresh=args.fresh,
        scratch=args.scratch,
        stop_after_steps=args.stop_after_steps,
        families=args.families.split(",") if args.families else None,
    )
    try:
        if args.contender:
            output: BaseModel | None = contender_for_run(
                store,
                args.run_id,
                settings,
                args.contender,
                device_preference=args.device,
                options=options,
            )
        else:
            output = train_for_run(
                store, args.run_id, settings, device_preference=args.device, options=options
            )
    except TrainingInterrupted as exc:
        print(f"hybridflow train: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (HybridflowInputError, StoreError, FileNotFoundError) as exc:
        print(f"hybridflow train: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutdown_distributed()
    if output is not None and args.result_file is not None:
        args.result_file.write_text(output.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
