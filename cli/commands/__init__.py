"""CLI subcommands, one module each. A module exposes ``register(subparsers)`` and sets
``handler`` on its parser(s); :data:`COMMAND_MODULES` lists them in help order."""

COMMAND_MODULES: tuple[str, ...] = (
    "cli.commands.demo_data",
    "cli.commands.run",
    "cli.commands.stages",
    "cli.commands.models",
    "cli.commands.snapshots",
    "cli.commands.serve",
    "cli.commands.events",
    "cli.commands.refresh",
    "cli.commands.drift",
    "cli.commands.plan",
    "cli.commands.stack",
    "cli.commands.jvm_archive",
)
