"""``hybridflow snapshots list|retire|repair``: the runs' feature datasets (scoring features,
training snapshots), which production serves, and their upkeep (:mod:`infra.storage.snapshots`)."""

from __future__ import annotations

import argparse

from cli.args import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add the subcommand and its actions."""
    snapshots = sub.add_parser(
        "snapshots", help="the runs' scoring features and training snapshots"
    )
    ssub = snapshots.add_subparsers(dest="snapshots_command", required=True)
    ssub.add_parser(
        "list", help="every feature dataset, oldest date first; the versions recording it"
    ).set_defaults(handler=list_snapshots)
    retire = ssub.add_parser(
        "retire", help="delete a dataset no production or rollback version records"
    )
    retire.add_argument("prefix", help="as `snapshots list` prints it")
    retire.set_defaults(handler=retire_snapshot)
    repair = ssub.add_parser(
        "repair", help="rewrite a damaged dataset manifest to name its newest whole generation"
    )
    repair.add_argument("prefix", help="as the refusal names it")
    repair.set_defaults(handler=repair_snapshot)


def _store():
    from infra.settings import get_settings
    from infra.storage.store import open_store

    return open_store(get_settings().store)


def list_snapshots(args: argparse.Namespace) -> int:
    """One line per dataset: kind, prefix, rows, when published, the versions recording it."""
    from infra.storage.snapshots import list_datasets

    datasets = list_datasets(_store())
    if not datasets:
        print("no feature datasets yet")
    for d in datasets:
        if d.manifest is None:
            state = f"DAMAGED: {d.damage}"
        else:
            state = f"{d.manifest.rows} rows  {d.manifest.created_at:%Y-%m-%d %H:%M:%S}"
        used = f"  served/needed by {', '.join(d.used_by)}" if d.used_by else ""
        print(f"{d.kind:<8}  {d.prefix}  {state}{used}")
    return EXIT_OK


def retire_snapshot(args: argparse.Namespace) -> int:
    """Delete one dataset (exit 2 when a production or rollback version records it)."""
    from infra.storage.snapshots import retire

    dataset = retire(_store(), args.prefix)
    print(f"retired {dataset.prefix}")
    return EXIT_OK


def repair_snapshot(args: argparse.Namespace) -> int:
    """Rewrite a damaged manifest (exit 2 when nothing whole is left to name)."""
    from infra.storage.snapshots import repair

    manifest = repair(_store(), args.prefix)
    print(f"{manifest.prefix} -> {manifest.data_prefix} ({manifest.rows} rows)")
    return EXIT_OK
