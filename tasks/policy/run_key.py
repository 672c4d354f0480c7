"""A stable key for a pipeline run: the same inputs and parameters give the same key, so a re-run
finds the stage manifests (``runs/<key>/<stage>.json``) the failed run already published."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infra.errors import HybridflowInputError
from tasks.ml.warm_start import CODE_VERSION


def events_fingerprint(events: str) -> str:
    """sha256 over the events' file listing: relative path, size and mtime (or ETag on S3).

    Cheap (no data read) and changes whenever a file is added, removed or rewritten.
    """
    if events.startswith("s3://"):
        entries = _s3_listing(events)
    else:
        root = Path(events).expanduser()
        if not root.exists():
            raise HybridflowInputError(f"events {events}: no such file or folder")
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        entries = []
        for path in files:
            st = path.stat()
            rel = path.name if path == root else path.relative_to(root).as_posix()
            entries.append([rel, st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


def _s3_listing(uri: str) -> list[list[Any]]:
    import boto3

    bucket, _, prefix = uri[len("s3://") :].partition("/")
    paginator = boto3.client("s3").get_paginator("list_objects_v2")
    return [
        [obj["Key"], obj["Size"], obj["ETag"]]
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
        for obj in page.get("Contents", [])
    ]


def pipeline_run_key(parameters: dict[str, Any], events_fp: str) -> str:
    """``run-<16 hex>`` from the run's parameters (JSON-able), the events fingerprint and the
    code version. Parameters that do not change outputs must be left out by the caller."""
    payload = json.dumps(
        {"parameters": parameters, "events": events_fp, "code": CODE_VERSION},
        sort_keys=True,
        default=str,
    )
    return "run-" + hashlib.sha256(payload.encode()).hexdigest()[:16]
