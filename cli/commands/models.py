"""``hybridflow models list|show|promote|rollback``: the model registry."""

from __future__ import annotations

import argparse
import sys

from cli.args import EXIT_FAILURE, EXIT_OK
from infra.errors import HybridflowInputError


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand and its actions."""
    models = sub.add_parser("models", help="the model registry")
    msub = models.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="all versions, oldest first").set_defaults(handler=list_models)
    show = msub.add_parser("show", help="one version's manifest, its files verified")
    show.add_argument("version", nargs="?", default=None, help="default: production")
    show.set_defaults(handler=show_model)
    promote = msub.add_parser(
        "promote", help="point production at a version (also repairs a damaged alias file)"
    )
    promote.add_argument("version")
    promote.add_argument("--reason", default="promoted by hand")
    promote.set_defaults(handler=promote_model)
    rollback = msub.add_parser(
        "rollback", help="undo production's latest promotion (repeatable: walks the history)"
    )
    rollback.set_defaults(handler=rollback_model)


def _registry():
    from infra.settings import get_settings
    from infra.storage.registry import ModelRegistry
    from infra.storage.store import open_store

    return ModelRegistry(open_store(get_settings().store))


def _production_or_damage(registry) -> tuple[str | None, str | None]:
    """``(production version, None)``, or ``(None, what is wrong)`` for a damaged alias."""
    from infra.storage.registry import AliasDamaged

    try:
        record = registry.alias()
    except AliasDamaged as exc:
        return None, str(exc)
    return (record.version if record else None), None


def list_models(args: argparse.Namespace) -> int:
    """One line per version; ``*`` marks production."""
    registry = _registry()
    production, damage = _production_or_damage(registry)
    if damage:
        print(f"hybridflow: warning: {damage}", file=sys.stderr)
    versions = registry.list_versions()
    if not versions:
        print("no model versions yet")
    for m in versions:
        mark = "*" if m.version == production else " "
        auc = m.metrics.get("test_auc")
        auc_text = f"test_auc={auc:.4f}" if auc is not None else "test_auc=-"
        print(
            f"{mark} {m.version}  {m.created_at:%Y-%m-%d %H:%M:%S}  {auc_text}  "
            f"parent={m.parent_version or '-'}"
        )
    return EXIT_OK


def show_model(args: argparse.Namespace) -> int:
    """A version's manifest as JSON (production by default); exit 1 when its files do not
    verify, with what is wrong on stderr."""
    registry = _registry()
    version = args.version
    if version is None:
        version, damage = _production_or_damage(registry)
        if damage:
            raise HybridflowInputError(f"{damage}; or name a version")
        if version is None:
            raise HybridflowInputError("no production model yet; name a version")
    print(registry.get(version).model_dump_json(indent=2))
    problems = registry.verify(version)
    if problems:
        print(
            f"hybridflow: model version {version} is damaged: {'; '.join(problems)}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return EXIT_OK


def promote_model(args: argparse.Namespace) -> int:
    """Point production at a verified version (compare-and-swap against the current alias;
    a damaged alias file is replaced)."""
    registry = _registry()
    before, damage = _production_or_damage(registry)
    expected = False if damage else before
    record = registry.set_alias(args.version, args.reason, expected_version=expected)
    was = "a damaged alias file" if damage else before or "unset"
    print(f"production -> {record.version} (was {was})")
    return EXIT_OK


def rollback_model(args: argparse.Namespace) -> int:
    """Undo production's latest promotion that was not undone yet."""
    from infra.storage.registry import AliasDamaged

    registry = _registry()
    try:
        before = registry.alias()
        record = registry.rollback()
    except AliasDamaged as exc:
        raise HybridflowInputError(f"cannot roll back: {exc}") from None
    print(f"production rolled back -> {record.version} (was {before.version if before else '-'})")
    return EXIT_OK
