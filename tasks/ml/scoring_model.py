"""The model a scoring run uses: the requested registry version or production's, its bundle
read and verified against the manifest's sha256s (batch inference and the drift check)."""

from __future__ import annotations

from infra.errors import HybridflowInputError
from infra.storage.registry import ModelRegistry
from infra.storage.store import ObjectStore
from tasks.ml.scoring_worker import ScoringModel


def resolve_model_version(registry: ModelRegistry, model_version: str | None) -> str:
    """The requested version, or the one ``production`` points at."""
    if model_version:
        return model_version
    production = registry.alias()
    if production is None:
        raise HybridflowInputError("no production model yet: train one first (hybridflow run)")
    return production.version


def load_scoring_model(store: ObjectStore, model_version: str | None) -> ScoringModel:
    """The version's bundle bytes, verified against the registry manifest's sha256s."""
    registry = ModelRegistry(store)
    version = resolve_model_version(registry, model_version)
    manifest, files = registry.read_files(version)
    return ScoringModel(
        version=version, files=files, sha256=dict(manifest.files), features=manifest.features
    )
