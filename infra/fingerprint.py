"""Fingerprints of a stage's inputs: files (names, sizes, mtimes), parameters and code version.

Two runs with the same fingerprint would compute the same output, so the second can reuse the
first's (see :mod:`infra.storage.stage_cache`). A stage's code is every project module its module reaches
through its imports (:func:`code_modules`, read from the source files), so no list of modules is
kept by hand.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PROJECT_PACKAGES = ("tasks.", "infra.")  # the code a stage's outputs can depend on
# an import statement's first line (lazy ones too): ``from <source> import ...`` or ``import <names>``
IMPORT_LINE = re.compile(
    r"^[ \t]*(?:from[ \t]+(?P<source>[\w.]+)[ \t]+import\b|import[ \t]+(?P<names>[\w., \t]+))", re.M
)


def _source(module: str) -> Path | None:
    """The source file of ``module`` (found, not imported)."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _project_imports(module: str) -> set[str]:
    """The project modules ``module``'s source imports (anywhere in it, lazily too)."""
    source = _source(module)
    if source is None:
        return set()
    found = set()
    for match in IMPORT_LINE.finditer(source.read_text()):
        if match["source"]:
            found.add(match["source"])
        else:
            found.update(name.split(" as ")[0].strip() for name in match["names"].split(","))
    return {m for m in found if m.startswith(PROJECT_PACKAGES)}


@cache
def code_modules(module: str) -> tuple[str, ...]:
    """``module`` and every project module it reaches through its imports, sorted: the code a
    stage's cached output depends on."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(_project_imports(current) - seen)
    return tuple(sorted(seen))


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
        source = _source(name)
        h.update(name.encode())
        if source:
            h.update(source.read_bytes())
    try:
        version = metadata.version("hybridflow")
    except metadata.PackageNotFoundError:
        version = "0"
    return f"{version}+{h.hexdigest()[:16]}"


def stage_fingerprint(stage: str, **parts: Any) -> str:
    """A stable sha256 of the stage name and its JSON-able inputs."""
    doc = json.dumps({"stage": stage, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()
