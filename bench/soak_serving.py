"""Soak: the endpoint under concurrent load for minutes while its registry is abused.

Every few seconds one fault, in a cycle: a good version promoted, a version damaged after its
promotion, a rollback, the alias file truncated, the alias repaired by a promotion, a version
that scores NaN. Valid requests (known customers) must never fail; each refusal must show in
``/metrics`` (reload failures by reason) and in ``/ready`` (``last_reload_error``) and go away
from ``/ready`` once the alias is good again; the endpoint's memory must stay flat. All the while,
hostile clients (:mod:`bench.hostile_clients`) hold 300 idle kept-alive connections and 300
slowloris senders (600 together, over the endpoint's 512) and send a 4 MiB header twice a
second: the valid requests must still all be answered, the refusals logged as a few lines of
counts.

Not part of ``make bench`` (it takes minutes): ``python -m bench.soak_serving --minutes 3``.
Prints one JSON summary line; the figures are in docs/durability.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.bench_serving import CUSTOMERS, Server, _finish_load, _server, _start_load
from bench.hostile_clients import HostileClients

CONCURRENCY = 8
FAULT_EVERY_S = 4.0
SETTLE_TIMEOUT_S = 30.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _connection_metrics(url: str) -> dict[str, float]:
    """What the endpoint dropped (by reason) and the idle connections it closed."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hybridflow_serving_dropped_requests_total":
                out[sample.labels["reason"]] = sample.value
            elif sample.name == "hybridflow_serving_idle_connections_closed_total":
                out["idle_closed"] = sample.value
    return out


def _reload_failures(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hybridflow_serving_model_reload_failures_total":
                out[sample.labels["reason"]] = sample.value
            elif sample.name == "hybridflow_serving_model_reloads_total":
                out["reloads"] = sample.value
            elif sample.name == "hybridflow_serving_requests_total":
                out[f"{sample.labels['route']} {sample.labels['status']}"] = sample.value
    return out


def _wait(what: str, probe: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.1)
    print(f"soak: timed out waiting for {what}", file=sys.stderr)
    return False


class Faults:
    """The fault cycle against one store; counts what the endpoint must have refused."""

    def __init__(self, store, table, url: str) -> None:
        from infra.storage.registry import ModelRegistry

        self.store, self.table, self.url = store, table, url
        self.registry = ModelRegistry(store)
        self.expected: Counter[str] = Counter()
        self.seen_in_ready: Counter[str] = Counter()
        self.cleared_in_ready = 0
        self.seeds = iter(range(100, 100_000))

    def ready(self) -> dict:
        return httpx.get(f"{self.url}/ready", timeout=30).json()

    def serving(self, version: str) -> bool:
        return self.ready()["model_version"] == version

    def refused(self, reason: str, needle: str) -> None:
        self.expected[reason] += 1
        if _wait(
            f"/ready to show {reason}", lambda: needle in (self.ready()["last_reload_error"] or "")
        ):
            self.seen_in_ready[reason] += 1

    def cleared(self) -> None:
        if _wait("/ready to clear its error", lambda: self.ready()["last_reload_error"] is None):
            self.cleared_in_ready += 1

    def promote_good(self) -> None:
        from tests.fixtures.serving_sample import register_sample_model

        version = register_sample_model(self.store, self.table, seed=next(self.seeds))
        _wait(f"{version} to be served", lambda: self.serving(version))
        self.cleared()

    def damaged_after_promotion(self) -> None:
        from infra.layout import version_file_key
        from tests.fixtures.serving_sample import point_alias_unverified, register_sample_model

        seed = next(self.seeds)
        version = register_sample_model(self.store, self.table, seed=seed, promote=False)
        path = self.store.local_path(version_file_key(version, "model.pt"))
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        point_alias_unverified(self.store, version, "soak: damaged after its promotion")
        self.refused("checksum", version)

    def rollback(self) -> None:
        target = self.registry.rollback().version
        _wait(f"rollback to {target}", lambda: self.serving(target))
        self.cleared()

    def truncate_alias(self) -> None:
        from infra.layout import alias_key

        path = self.store.local_path(alias_key("production"))
        path.write_bytes(path.read_bytes()[:40])
        self.refused("alias_damaged", "is damaged")

    def repair_alias(self) -> None:
        served = self.ready()["model_version"]
        self.registry.set_alias(served, "soak: repair the alias")
        self.cleared()

    def nan_version(self) -> None:
        from tests.fixtures.serving_sample import register_sample_model

        version = register_sample_model(
            self.store, self.table, seed=next(self.seeds), nan_weights=True
        )
        self.refused("warmup_nan", version)
        self.registry.rollback()
        self.cleared()

    def cycle(self) -> list[Callable[[], None]]:
        return [
            self.promote_good,
            self.damaged_after_promotion,
            self.rollback,
            self.truncate_alias,
            self.repair_alias,
            self.nan_version,
        ]


def soak(minutes: float) -> dict:
    """Run the soak; the summary as a dict."""
    from infra.storage.store import LocalFolderStore
    from tests.fixtures.serving_sample import (
        publish_sample_snapshot,
        register_sample_model,
        sample_feature_table,
    )

    seconds = minutes * 60
    with tempfile.TemporaryDirectory(prefix="hf-soak-") as tmp:
        root = Path(tmp)
        store = LocalFolderStore(root / "store")
        table = sample_feature_table(CUSTOMERS, seed=1)
        publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
        register_sample_model(store, table, seed=1)
        env = {"HYBRIDFLOW_STORE": str(root / "store"), "HYBRIDFLOW_SERVE__POLL_INTERVAL_S": "0.25"}
        with _server([sys.executable, "-m", "serving", "--port", "0"], root / "ep", env) as ep:
            return _drive(ep, store, table, seconds, root / "ep" / "log")


def _drive(endpoint: Server, store, table, seconds: float, log: Path) -> dict:
    faults = Faults(store, table, endpoint.url)
    rss_start = _rss_mib(endpoint.pid)
    loadgen = _start_load(endpoint, CONCURRENCY, seconds)
    hostile = HostileClients(endpoint.url)
    hostile.start()
    started = time.monotonic()
    actions = 0
    rss_samples = [rss_start]
    steps = faults.cycle()
    while time.monotonic() - started < seconds - FAULT_EVERY_S * 2:
        steps[actions % len(steps)]()
        actions += 1
        rss_samples.append(_rss_mib(endpoint.pid))
        time.sleep(FAULT_EVERY_S)
    faults.promote_good()  # end on a good alias
    load = _finish_load(loadgen)
    attacks = hostile.stop()
    metrics = _reload_failures(endpoint.url)
    refusal_lines = [
        line for line in log.read_text(errors="replace").splitlines() if "serving.refusals" in line
    ]
    return {
        "seconds": round(seconds),
        "concurrency": CONCURRENCY,
        "requests": load["requests"],
        "failed_requests": load["errors"],
        "rps": round(load["rps"], 1),
        "p99_ms": round(load["p99_ms"], 2),
        "versions_answered": len(load["versions"]),
        "fault_actions": actions,
        "reloads": metrics.get("reloads", 0),
        "refusals_expected": dict(faults.expected),
        "refusals_in_metrics": {r: metrics.get(r, 0) for r in faults.expected},
        "refusals_seen_in_ready": dict(faults.seen_in_ready),
        "ready_cleared_after_recovery": faults.cleared_in_ready,
        "ready_error_at_end": faults.ready()["last_reload_error"],
        "rss_mib_start": round(rss_start, 1),
        "rss_mib_end": round(_rss_mib(endpoint.pid), 1),
        "rss_mib_max": round(max(rss_samples), 1),
        "predict_statuses": {k: v for k, v in metrics.items() if k.startswith("/predict ")},
        "hostile_clients": attacks,
        "endpoint_dropped": _connection_metrics(endpoint.url),
        "refusal_log_lines": len(refusal_lines),
        "last_refusal_line": refusal_lines[-1][-300:] if refusal_lines else None,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its summary; exit 1 when any promise was broken."""
    parser = argparse.ArgumentParser(prog="bench.soak_serving")
    parser.add_argument("--minutes", type=float, default=3.0)
    summary = soak(parser.parse_args(argv).minutes)
    print(json.dumps(summary))
    broken = (
        summary["failed_requests"]
        or summary["refusals_in_metrics"] != summary["refusals_expected"]
        or summary["refusals_seen_in_ready"] != summary["refusals_expected"]
        or summary["ready_error_at_end"] is not None
        or summary["refusal_log_lines"] > summary["seconds"] / 10 + 2  # one per 10 s interval
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
