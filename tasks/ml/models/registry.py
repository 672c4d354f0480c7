"""Model families by kind, and bundles loaded by the kind they record.

Like torchvision's ``register_model``/``get_model``: a family module registers its family with
:func:`register_family`; everything else asks :func:`get_family` / :func:`load_model` and never
imports a concrete model class. The built-in families' modules are listed in
:data:`BUILTIN_FAMILY_MODULES` (adding a family: its module, and one line there).

A bundle's ``model.json`` names its ``kind``; bundles written before families existed have no
kind and are the MLP they always were.
"""

from __future__ import annotations

import importlib
import json
import threading
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from infra.errors import ChecksumMismatchError, HybridflowInputError
from infra.storage.store import sha256_bytes
from tasks.ml.models.base import CONFIG_FILE, FamilySpec, FittedModel, ModelFamily

LEGACY_KIND = "mlp"  # what a bundle without a kind is
BUILTIN_FAMILY_MODULES: tuple[str, ...] = (
    "tasks.ml.models.rfm",
    "tasks.ml.models.logistic",
    "tasks.ml.models.gbm",
    "tasks.ml.models.mlp",
    "tasks.ml.models.sequence",
)

_families: dict[str, ModelFamily] = {}
_lock = threading.Lock()
_builtins_loaded = False


def register_family(family: ModelFamily) -> ModelFamily:
    """Make ``family`` available by its ``kind`` (a kind registered twice is an error, unless it
    is the same family object again)."""
    with _lock:
        current = _families.get(family.kind)
        if current is not None and current is not family:
            raise ValueError(f"model family {family.kind!r} is registered already")
        _families[family.kind] = family
    return family


def unregister_family(kind: str) -> None:
    """Forget a family (tests that register a toy one)."""
    with _lock:
        _families.pop(kind, None)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in BUILTIN_FAMILY_MODULES:
            importlib.import_module(module)
        _builtins_loaded = True


def list_families() -> list[str]:
    """Every registered kind, sorted."""
    _load_builtins()
    return sorted(_families)


def get_family(kind: str) -> ModelFamily:
    """The family registered as ``kind``; HybridflowInputError naming the known ones."""
    _load_builtins()
    family = _families.get(kind)
    if family is None:
        raise HybridflowInputError(
            f"unknown model family {kind!r}: known families are {', '.join(list_families())}"
        )
    return family


def family_specs(
    kinds: list[str], overrides: dict[str, dict[str, Any]] | None = None
) -> list[FamilySpec]:
    """The specs of ``kinds`` (in that order, duplicates dropped) with per-kind ``overrides``;
    HybridflowInputError for an unknown kind, an empty list or a bad override."""
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(list_families()))
    if unknown:
        raise HybridflowInputError(
            f"settings for unknown model famil{'ies' if len(unknown) > 1 else 'y'} "
            f"{', '.join(unknown)}: known families are {', '.join(list_families())}"
        )
    if not kinds:
        raise HybridflowInputError("no model family to train: name at least one")
    specs = []
    for kind in dict.fromkeys(kinds):
        try:
            specs.append(get_family(kind).spec(overrides.get(kind)))
        except ValueError as exc:  # pydantic's ValidationError
            raise HybridflowInputError(f"settings of model family {kind!r}: {exc}") from None
    return specs


def spec_adapter() -> TypeAdapter[Any]:
    """A validator of any registered family's spec, discriminated on ``kind``."""
    types = tuple(get_family(k).spec_type for k in list_families())
    union = types[0] if len(types) == 1 else Union[types]  # noqa: UP007
    return TypeAdapter(Annotated[union, Field(discriminator="kind")])


def bundle_kind(config: dict[str, Any]) -> str:
    """The kind a bundle's ``model.json`` records (none: the legacy MLP)."""
    return str(config.get("kind") or LEGACY_KIND)


def verify_bundle(files: dict[str, bytes], sha256: dict[str, str]) -> None:
    """ChecksumMismatchError unless every file the manifest names is there and matches, and the
    bundle has a ``model.json``; nothing is parsed before this passes."""
    if CONFIG_FILE not in files or CONFIG_FILE not in sha256:
        raise ChecksumMismatchError(f"model bundle lacks {CONFIG_FILE} or its checksum")
    for name, expected in sorted(sha256.items()):
        if name not in files:
            raise ChecksumMismatchError(f"model bundle lacks {name} or its checksum")
        actual = sha256_bytes(files[name])
        if actual != expected:
            raise ChecksumMismatchError(
                f"{name}: sha256 {actual[:12]}... does not match manifest {expected[:12]}..."
            )
    unlisted = sorted(set(files) - set(sha256))
    if unlisted:
        raise ChecksumMismatchError(f"model bundle file(s) {unlisted} have no checksum")


def load_model(files: dict[str, bytes], sha256: dict[str, str]) -> FittedModel:
    """Verify every file against ``sha256``, then rebuild the model its ``kind`` names."""
    verify_bundle(files, sha256)
    config = json.loads(files[CONFIG_FILE])
    return get_family(bundle_kind(config)).load(config, files)
