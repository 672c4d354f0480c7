"""A run's way to its first stage imports nothing heavy: torch, PySpark, LightGBM and
scikit-learn are imported by the stages that use them (a fresh interpreter, since this one has
them all)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "pyspark", "lightgbm", "sklearn")

# what `hybridflow run` imports and runs before its first stage: the CLI and the run command,
# its input pre-check and engine choice, Prefect's API helper, the pipeline flow and planning
# with every family's cost hints
BEFORE_THE_FIRST_STAGE = """
import json, sys
import cli.main, cli.commands.run, cli.args
import flows.pipeline
import infra.prefect_runtime.api, infra.compute.spark
import tasks.data.engine_choice, tasks.data.input_formats
from infra.settings import get_settings
from tasks.ml.models import list_families
from tasks.policy.planning import contender_costs, model_cost

settings = get_settings()
families = list_families()
contender_costs(families, 20, settings)
model_cost(families, 20, settings)
heavy = set(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"families": families, "loaded": loaded}))
"""


def test_nothing_heavy_is_imported_before_the_first_stage():
    done = subprocess.run(
        [sys.executable, "-c", BEFORE_THE_FIRST_STAGE, *HEAVY],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"logistic", "gbm", "mlp", "sequence"} <= set(found["families"])
    assert found["loaded"] == [], f"imported before the first stage: {found['loaded'][:10]}"


def test_the_network_classes_are_still_found_where_they_were():
    """The torch halves of the network families are imported on first use by their old
    names."""
    from tasks.ml.models import mlp, sequence

    assert mlp.CustomerMLP.__module__ == "tasks.ml.models.mlp_network"
    assert mlp.MLPModel.__name__ == "MLPModel"
    assert sequence.SequenceNet.__module__ == "tasks.ml.models.sequence_network"
    assert callable(mlp.network_from_state) and callable(sequence.network_from_state)


# every flow module prefect.yaml deploys: `prefect deploy` imports each entrypoint's module
DEPLOYED_FLOWS = """
import json, sys, importlib, yaml
entrypoints = {d["entrypoint"] for d in yaml.safe_load(open("prefect.yaml"))["deployments"]}
modules = sorted({e.split(":")[0].removesuffix(".py").replace("/", ".") for e in entrypoints})
for name in modules:
    importlib.import_module(name)
heavy = set(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(json.dumps({"modules": modules, "loaded": loaded}))
"""


def test_the_deployed_flows_import_no_torch():
    """Loading a flow (``prefect deploy``, a worker's flow run) pays no torch or pandas (4.4 s of
    a deploy on a 2-core box); the stages import them when they train or read a snapshot."""
    done = subprocess.run(
        [sys.executable, "-c", DEPLOYED_FLOWS, "torch", "pandas", "lightgbm", "sklearn"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"flows.train", "flows.contender", "flows.pipeline"} <= set(found["modules"])
    assert found["loaded"] == [], f"imported by the deployed flows: {found['loaded'][:10]}"


# the train stage twice on one snapshot, each in a fresh interpreter: the first fits every
# contender; the second finds the network's fit (and rfm's) done, refits gbm where it
# warm-starts from a gbm production model, judges, gates, scores with every servable contender
# that is not a network, and reports what it imported
TRAIN_TWICE = """
import json, sys
from pathlib import Path
import numpy as np
from infra.settings import HybridflowSettings
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from tasks.ml.models import load_model, predict_proba
from tasks.reporting.records import FeaturesResult, PreprocessResult
from tasks.stages.train import TrainingOptions, train_stage

root, step = Path(sys.argv[1]), sys.argv[2]
store = LocalFolderStore(root / "store")
if step == "fit":
    from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

    features, prepared = publish_synthetic_snapshot(store, "r", rows=3000, seed=3)
    (root / "features.json").write_text(features.model_dump_json())
    (root / "prepared.json").write_text(prepared.model_dump_json())
features = FeaturesResult.model_validate_json((root / "features.json").read_text())
prepared = PreprocessResult.model_validate_json((root / "prepared.json").read_text())
settings = HybridflowSettings(train={"max_epochs": 2, "patience": 1})
output = train_stage(
    store, prepared, settings, as_of=features.as_of, horizon_days=features.horizon_days,
    device_preference="cpu", options=TrainingOptions(families=["rfm", "gbm", "mlp"]),
)
registry = ModelRegistry(store)
scored = {}
for row in output.result.leaderboard:
    if row.family != "mlp":
        manifest, files = registry.read_files(row.version)
        model = load_model(files, manifest.files)
        scored[row.family] = len(predict_proba(model, np.ones((3, len(model.features)))))
print(json.dumps({
    "reused": {row.family: row.reused for row in output.result.leaderboard},
    "production": registry.get(registry.alias().version).kind,
    "scored": scored,
    "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:5],
}))
"""


def test_a_run_whose_network_fit_is_done_imports_no_torch(tmp_path):
    """A run that reuses its network contender's fit pays no torch (2 s of CPU, a quarter of a
    small run): its device is chosen, and its other families fitted, judged and scored, without
    it. The first run, which fits the network, does import it."""

    def train(step: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", TRAIN_TWICE, str(tmp_path), step],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = train("fit")
    assert first["torch"] and not any(first["reused"].values())
    again = train("again")
    assert again["reused"]["mlp"] and again["reused"]["rfm"] and again["production"] != "mlp"
    assert again["scored"] == {"rfm": 3, "gbm": 3}
    assert again["torch"] == [], f"imported by a run that fitted no network: {again['torch']}"


# a network fit stopped after 30 steps with checkpoints, then resumed to its end, in a fresh
# interpreter: what it imported of torch._dynamo (torch.optim's optimisers import it)
FIT_AND_RESUME = """
import json, sys
from pathlib import Path
from infra.settings import TrainingSettings
from infra.storage.datasets import local_dataset_dir, read_dataset_manifest
from infra.storage.store import LocalFolderStore
from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore
from tasks.ml.models import FitJob
from tasks.ml.models.mlp import MLPFamily, MLPSpec
from tasks.ml.normalizer import Normalizer
from tasks.ml.snapshot_reader import SnapshotStream
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

store = LocalFolderStore(Path(sys.argv[1]) / "store")
_, prepared = publish_synthetic_snapshot(store, "r", rows=2000, seed=4)
manifest = read_dataset_manifest(store, prepared.snapshot_prefix)
normalizer = Normalizer.model_validate(manifest.metadata["normalizer"])
data = SnapshotStream(local_dataset_dir(store, manifest), normalizer.features)
settings = TrainingSettings(batch_size=64, max_epochs=2, patience=2, threads=1)

def fit(stop):
    job = FitJob(
        data=data, normalizer=normalizer, settings=settings,
        checkpoints=CheckpointStore(store, "t-lazy"),
        checkpoint_policy=CheckpointPolicy(every_steps=10, every_seconds=0),
        stop_after_steps=stop,
    )
    return MLPFamily().fit(MLPSpec(), job)

first, resumed = fit(30), fit(None)
print(json.dumps({
    "interrupted": first.interrupted,
    "resumed_from_step": resumed.record["resumed_from_step"],
    "steps": resumed.record["steps"],
    "dynamo": sorted(m for m in sys.modules if m.startswith("torch._dynamo"))[:5],
}))
"""


def test_a_network_fit_and_its_resume_import_no_torch_dynamo(tmp_path):
    """The training loop's own AdamW and plateau schedule (tasks.ml.adamw, tasks.ml.plateau):
    torch.optim's would import torch._dynamo, 1.2-1.3 s of CPU in a small run."""
    done = subprocess.run(
        [sys.executable, "-c", FIT_AND_RESUME, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["interrupted"] and found["resumed_from_step"] == 30 and found["steps"] > 30
    assert found["dynamo"] == [], f"imported by a network fit: {found['dynamo']}"
