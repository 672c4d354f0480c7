"""``hybridflow models list|show|promote|rollback``: the model registry."""

from __future__ import annotations

import argparse

from cli.args import EXIT_OK
from infra.errors import HybridflowInputError


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand and its actions."""
    models = sub.add_parser("models", help="the model registry")
    msub = models.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="all versions, oldest first").set_defaults(handler=list_models)
    show = msub.add_parser("show", help="one version's manifest")
    show.add_argument("version", nargs="?", default=None, help="default: production")
    show.set_defaults(handler=show_model)
    promote = msub.add_parser("promote", help="point production at a version")
    promote.add_argument("version")
    promote.add_argument("--reason", default="promoted by hand")
    promote.set_defaults(handler=promote_model)
    rollback = msub.add_parser("rollback", help="point production back at its previous version")
    rollback.set_defaults(handler=rollback_model)


def _registry():
    from infra.registry import ModelRegistry
    from infra.settings import get_settings
    from infra.store import open_store

    return ModelRegistry(open_store(get_settings().store))


def list_models(args: argparse.Namespace) -> int:
    """One line per version; ``*`` marks production."""
    registry = _registry()
    production = registry.alias()
    versions = registry.list_versions()
    if not versions:
        print("no model versions yet")
    for m in versions:
        mark = "*" if production and m.version == production.version else " "
        auc = m.metrics.get("test_auc")
        auc_text = f"test_auc={auc:.4f}" if auc is not None else "test_auc=-"
        print(
            f"{mark} {m.version}  {m.created_at:%Y-%m-%d %H:%M:%S}  {auc_text}  "
            f"parent={m.parent_version or '-'}"
        )
    return EXIT_OK


def show_model(args: argparse.Namespace) -> int:
    """A version's manifest as JSON (production by default)."""
    registry = _registry()
    production = registry.alias()
    version = args.version or (production.version if production else None)
    if version is None:
        raise HybridflowInputError("no production model yet; name a version")
    print(registry.get(version).model_dump_json(indent=2))
    return EXIT_OK


def promote_model(args: argparse.Namespace) -> int:
    """Point production at a version (compare-and-swap against the current alias)."""
    registry = _registry()
    production = registry.alias()
    before = production.version if production else None
    record = registry.set_alias(args.version, args.reason, expected_version=before)
    print(f"production -> {record.version} (was {before or 'unset'})")
    return EXIT_OK


def rollback_model(args: argparse.Namespace) -> int:
    """Point production back at the version before its latest move."""
    registry = _registry()
    before = registry.alias()
    record = registry.rollback()
    print(f"production rolled back -> {record.version} (was {before.version if before else '-'})")
    return EXIT_OK
