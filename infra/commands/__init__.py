"""CLI subcommands, one module each. A module exposes ``register(subparsers)`` and sets
``handler`` on its parser(s); :data:`COMMAND_MODULES` lists them in help order."""

COMMAND_MODULES: tuple[str, ...] = (
    "infra.commands.demo_data",
    "infra.commands.run",
    "infra.commands.stages",
    "infra.commands.models",
    "infra.commands.serve",
    "infra.commands.refresh",
    "infra.commands.plan",
    "infra.commands.stack",
)
