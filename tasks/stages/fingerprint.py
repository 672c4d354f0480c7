"""Fingerprints of a stage's inputs: files (names, sizes, mtimes), parameters and code version.

Two runs with the same fingerprint would compute the same output, so the second can reuse the
first's (see :mod:`tasks.stages.cache`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any


def files_fingerprint(root: Path, files: list[Path]) -> list[list[Any]]:
    """``[relative name, size, mtime_ns]`` of each file: any rewrite, append or touch changes it."""
    out = []
    for f in sorted(files):
        st = f.stat()
        rel = f.relative_to(root).as_posix() if f != root else f.name
        out.append([rel, st.st_size, st.st_mtime_ns])
    return out


def code_version(*modules: str) -> str:
    """The package version plus a hash of the source of ``modules`` (the stage's own code)."""
    h = hashlib.sha256()
    for name in sorted(modules):
        source = importlib.import_module(name).__file__
        h.update(name.encode())
        if source:
            h.update(Path(source).read_bytes())
    try:
        version = metadata.version("hybridflow")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"{version}+{h.hexdigest()[:16]}"


def stage_fingerprint(stage: str, **parts: Any) -> str:
    """A stable sha256 of the stage name and its JSON-able inputs."""
    doc = json.dumps({"stage": stage, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()
