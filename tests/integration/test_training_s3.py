"""The train stage against a real S3 server (moto in server mode, HTTP on 127.0.0.1).

Checkpoints (write/read/verify, multipart, corrupt newest skipped), a training process killed
with SIGKILL and re-run, the store going down mid-save, concurrent promotions, DDP with two gloo
processes, and the ``hybridflow models`` commands.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from infra.errors import StoreError
from infra.settings import HybridflowSettings
from infra.storage.registry import ModelRegistry, PromotionConflict
from infra.storage.store import S3Store
from tasks.ml.checkpoints import CheckpointStore
from tasks.stages.train import train_stage
from tests.fixtures.moto_s3 import BUCKET, start_moto
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _settings(**train) -> HybridflowSettings:
    base = {"batch_size": 32, "max_epochs": 4, "threads": 1, "warm_start": False}
    base["families"] = ["mlp"]  # the network: checkpoints and their store
    return HybridflowSettings(train=base | train, checkpoint={"every_steps": 50, "keep": 3})


def _env(store: S3Store, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HYBRIDFLOW_STORE": store.uri,
            "HYBRIDFLOW_TRAIN__THREADS": "1",
            "HYBRIDFLOW_TRAIN__WARM_START": "false",
            "HYBRIDFLOW_TRAIN__FAMILIES": "mlp",  # the network: checkpoints, kills, DDP
            "HYBRIDFLOW_CHECKPOINT__EVERY_SECONDS": "0",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def test_checkpoints_write_read_verify_prune_and_skip_corrupt(s3_store, caplog):
    ckpts = CheckpointStore(s3_store, "t-roundtrip", keep=2)
    big = torch.arange(5_000_000, dtype=torch.float32)  # 20 MB: goes multipart
    for step in (10, 20, 30):
        ckpts.save(
            {"w": big + step, "progress": {"step": step}, "rng": torch.get_rng_state()},
            step=step,
            epoch=1,
            batch=step,
            samples_seen=step * 32,
        )
    assert [m.step for m in ckpts.manifests()] == [30, 20]  # keep=2 pruned step 10
    head = s3_store.client.head_object(
        Bucket=BUCKET, Key=s3_store._key("checkpoints/t-roundtrip/step-0000000030/state.pt")
    )
    assert "-" in head["ETag"]  # a multipart upload's ETag is "<md5 of parts>-<n parts>"
    blob = os.urandom(17 << 20)
    s3_store.put_bytes("big/blob.bin", blob)  # large put_bytes goes multipart too
    assert s3_store.get_bytes("big/blob.bin") == blob
    assert not any("step-0000000010" in k for k in s3_store.list("checkpoints/t-roundtrip"))
    loaded = ckpts.latest_valid()
    assert loaded.manifest.step == 30 and torch.equal(loaded.state["w"], big + 30)

    # the newest state object is truncated: its sha256 no longer matches, so step 20 is used
    key = "checkpoints/t-roundtrip/step-0000000030/state.pt"
    s3_store.put_bytes(key, s3_store.get_bytes(key)[:1000])
    with caplog.at_level(logging.WARNING, logger="tasks.ml.checkpoints"):
        loaded = ckpts.latest_valid()
    assert loaded.manifest.step == 20 and loaded.state["progress"] == {"step": 20}
    assert "checkpoint step 30 of training t-roundtrip skipped" in caplog.text
    assert "does not match" in caplog.text


@pytest.mark.slow(
    reason="two training processes (one killed with SIGKILL mid-fit, one resuming) against moto's S3 server"
)
@pytest.mark.e2e
def test_training_killed_with_sigkill_resumes_from_its_last_checkpoint(s3_store, tmp_path):
    _, prepared = publish_synthetic_snapshot(s3_store, "killed", rows=10_000, seed=3)
    env = _env(
        s3_store,
        HYBRIDFLOW_TRAIN__BATCH_SIZE="32",
        HYBRIDFLOW_TRAIN__MAX_EPOCHS="10",
        HYBRIDFLOW_TRAIN__PATIENCE="10",
        HYBRIDFLOW_CHECKPOINT__EVERY_STEPS="200",
        HYBRIDFLOW_CHECKPOINT__KEEP="10",
    )
    cmd = [
        sys.executable,
        "-m",
        "tasks.stages.train_process",
        "--run-id",
        "killed",
        "--device",
        "cpu",
    ]
    log1 = tmp_path / "first.log"
    with open(log1, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = [k for k in s3_store.list("checkpoints") if "/manifest-" in k]
            if steps:  # the first checkpoint (step 200 of 2190) is visible
                break
            assert proc.poll() is None, log1.read_text()
            time.sleep(0.05)
        assert proc.poll() is None, "training ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    tid = next(k.split("/")[1] for k in s3_store.list("checkpoints"))
    newest = CheckpointStore(s3_store, tid).latest_valid().manifest.step
    assert newest >= 200 and newest % 200 == 0
    assert ModelRegistry(s3_store).list_versions() == []  # nothing registered by the dead run

    result_file = tmp_path / "result.json"
    done = subprocess.run(
        [*cmd, "--result-file", str(result_file)],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"training {tid} resumed from checkpoint step {newest}" in done.stderr
    result = json.loads(result_file.read_text())["result"]
    per_epoch = math.ceil(prepared.split_counts["train"] / 32)
    assert result["resumed_from_step"] == newest
    assert result["steps"] == 10 * per_epoch  # same step count as a run that never died
    assert result["training_id"] == tid and result["promoted"] is True
    manifest = ModelRegistry(s3_store).get(result["model_version"])
    assert manifest.training["resumed_from_step"] == newest


def test_store_down_during_training_retries_then_fails_with_nothing_half_written(
    s3_endpoint, tmp_path, monkeypatch, caplog
):
    server, endpoint = start_moto()  # shares moto's in-process state, dies on its own
    stopped = False
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        store = S3Store(f"s3://{BUCKET}/store-down", retries=3, backoff_s=0.05)
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
        feats, prepared = publish_synthetic_snapshot(store, "down", rows=4000, seed=5)
        settings = _settings(max_epochs=30, patience=30)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                train_stage(store, prepared, settings, as_of=feats.as_of, horizon_days=90)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                errors.append(exc)

        with caplog.at_level(logging.WARNING, logger="infra.storage.store"):
            worker = threading.Thread(target=run)
            worker.start()
            deadline = time.monotonic() + 60
            while not any("/manifest-" in k for k in store.list("checkpoints")):
                assert time.monotonic() < deadline and worker.is_alive(), errors
                time.sleep(0.02)
        server.stop()
        stopped = True
        with caplog.at_level(logging.WARNING, logger="infra.storage.store"):
            worker.join(timeout=120)
        assert not worker.is_alive()
    finally:
        if not stopped:
            server.stop()
    assert len(errors) == 1 and isinstance(errors[0], StoreError), errors
    message = str(errors[0])
    assert "could not be saved" in message and "after 4 attempts" in message
    assert "retry 3" in caplog.text  # exponential backoff was tried before giving up

    # through the live server: every visible checkpoint verifies, and no model version exists
    live = S3Store(f"s3://{BUCKET}/store-down")
    ckpts = CheckpointStore(live, live.list("checkpoints")[0].split("/")[1])
    for manifest in ckpts.manifests():
        assert ckpts.load(manifest).manifest.step == manifest.step
    assert ModelRegistry(live).list_versions() == []
    assert ModelRegistry(live).alias() is None


def test_two_concurrent_promotions_exactly_one_wins(s3_store):
    registry = ModelRegistry(s3_store)
    versions = [
        registry.register({"model.pt": f"w{i}".encode()}, metrics={"test_auc": 0.8}).version
        for i in range(4)
    ]

    def race(candidates: list[str], expected: str | None) -> list[str]:
        barrier = threading.Barrier(len(candidates))
        outcomes: list[str] = [""] * len(candidates)

        def promote(i: int) -> None:
            own = ModelRegistry(S3Store(s3_store.uri))  # own client, as another process would
            barrier.wait()
            try:
                own.set_alias(candidates[i], "race", expected_version=expected)
                outcomes[i] = "won"
            except PromotionConflict as exc:
                outcomes[i] = f"lost: {exc}"

        threads = [threading.Thread(target=promote, args=(i,)) for i in range(len(candidates))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outcomes

    first = race(versions[:2], None)  # create-only write (If-None-Match: *)
    assert sorted(o == "won" for o in first) == [False, True], first
    winner = versions[first.index("won")]
    assert registry.alias().version == winner
    second = race(versions[2:], winner)  # compare-and-swap (If-Match: ETag)
    assert sorted(o == "won" for o in second) == [False, True], second
    assert "not promoted" in next(o for o in second if o != "won") or "moved" in next(
        o for o in second if o != "won"
    )
    record = registry.alias()
    assert record.version == versions[2 + second.index("won")]
    assert [h.version for h in record.history] == [winner, record.version]


@pytest.mark.slow(
    reason="torchrun starts two gloo training processes, twice (a fit and its resume)"
)
@pytest.mark.e2e
def test_ddp_two_gloo_processes_checkpoint_once_per_interval_and_resume(
    s3_store, prefect_harness, monkeypatch, capfd
):
    _, prepared = publish_synthetic_snapshot(s3_store, "ddp", rows=4000, seed=9)
    env = _env(
        s3_store,
        HYBRIDFLOW_TRAIN__BATCH_SIZE="32",
        HYBRIDFLOW_TRAIN__MAX_EPOCHS="6",
        HYBRIDFLOW_TRAIN__PATIENCE="6",
        HYBRIDFLOW_CHECKPOINT__EVERY_STEPS="40",
        HYBRIDFLOW_CHECKPOINT__KEEP="20",
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    from tasks.ml.ddp import ddp_command

    args = ["--run-id", "ddp", "--device", "cpu"]
    first = subprocess.run(
        ddp_command(2, [*args, "--stop-after-steps", "100"]),
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert first.returncode != 0 and "stopped after 100 steps" in first.stderr, first.stderr[-3000:]
    tid = next(k.split("/")[1] for k in s3_store.list("checkpoints"))
    ckpts = CheckpointStore(s3_store, tid)
    manifests = ckpts.manifests()
    assert [m.step for m in manifests] == [100, 80, 40]  # one per interval + the stop
    assert all(m.world_size == 2 for m in manifests)
    assert first.stderr.count("checkpoint step 40 saved") == 1  # rank 0 only

    # the resume goes through the train flow, which launches torchrun because of the setting
    from flows.params import StageParams
    from flows.train import train_flow
    from infra.settings import get_settings

    for name, value in env.items():
        if name.startswith(("HYBRIDFLOW_", "GLOO_", "OMP_")):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("HYBRIDFLOW_TRAIN__DDP_PROCESSES", "2")
    get_settings.cache_clear()
    capfd.readouterr()
    try:
        flow_result = train_flow(StageParams(run_id="ddp", store=s3_store.uri, device="cpu"))
    finally:
        get_settings.cache_clear()
    captured = capfd.readouterr()
    second = captured.out + captured.err
    for rank in (0, 1):
        assert (
            f"rank{rank} tasks.ml.network_fit: training {tid} resumed from checkpoint step 100"
            in second
        )
    result = flow_result.model_dump()
    per_rank_epoch = math.ceil(prepared.split_counts["train"] / 32) // 2
    assert result["resumed_from_step"] == 100
    assert result["steps"] == 6 * per_rank_epoch
    steps = sorted(m.step for m in ckpts.manifests())
    final = result["steps"]
    assert steps == sorted({*range(40, final + 1, 40), 100, final})  # each interval exactly once
    assert ModelRegistry(s3_store).get(result["model_version"]).training["world_size"] == 2


def test_models_cli_list_show_promote_rollback(s3_store, monkeypatch, capsys):
    from cli.main import main
    from infra.settings import get_settings

    registry = ModelRegistry(s3_store)
    a = registry.register({"model.pt": b"a"}, metrics={"test_auc": 0.81}).version
    b = registry.register({"model.pt": b"b"}, metrics={"test_auc": 0.83}, parent_version=a).version
    monkeypatch.setenv("HYBRIDFLOW_STORE", s3_store.uri)
    get_settings.cache_clear()
    try:
        assert main(["models", "promote", a]) == 0
        assert main(["models", "promote", b, "--reason", "better"]) == 0
        capsys.readouterr()
        assert main(["models", "list"]) == 0
        listing = capsys.readouterr().out
        assert f"* {b}" in listing and f"  {a}" in listing and "test_auc=0.8300" in listing
        assert main(["models", "show"]) == 0
        assert json.loads(capsys.readouterr().out)["version"] == b
        assert main(["models", "rollback"]) == 0
        assert f"production rolled back -> {a}" in capsys.readouterr().out
        assert registry.alias().version == a
        assert main(["models", "show", "m-does-not-exist"]) == 2
        assert "model version not found" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()


def test_client_errors_fail_at_once_without_retries(s3_endpoint, caplog):
    missing = S3Store("s3://no-such-bucket-hf/x", retries=3, backoff_s=0.5)
    sent: list[str] = []  # every HTTP request, botocore's own retries included
    missing.client.meta.events.register(
        "before-send.s3", lambda request, **_: sent.append(request.method)
    )
    with caplog.at_level(logging.WARNING, logger="infra.storage.store"):
        with pytest.raises(StoreError, match="NoSuchBucket"):
            missing.put_bytes("a.json", b"{}")
    assert sent == ["PUT"] and "retry" not in caplog.text
