"""The ``haze`` command line: ``haze make:job``, ``haze queue:work``, ``haze queue:failed``, …

Each command group lives in its own module and registers its commands on the root
group from :mod:`haze.cli._core` with ``@cli.command("group:name")``. A new group is a
new module plus one entry in :data:`COMMAND_MODULES`; nothing else changes.

click and rich come with the ``haze[cli]`` extra. They are imported only when the
CLI runs, so the runtime itself stays dependency-free.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click

__all__ = ["COMMAND_MODULES", "get_cli", "main"]

#: Modules whose import registers commands on the root group, in help order.
COMMAND_MODULES: tuple[str, ...] = (
    "haze.cli.init",
    "haze.cli.make",
    "haze.cli.db",
    "haze.cli.queue",
    "haze.cli.queue_admin",
    "haze.cli.queue_stats",
    "haze.cli.schedule",
    "haze.cli.infra",
    "haze.cli.build",
    "haze.cli.dashboard",
)

MISSING_DEPENDENCIES = "The haze CLI needs click and rich: pip install 'haze[cli]'"


def get_cli() -> click.Group:
    """The root ``haze`` group with every command module registered (for CliRunner)."""
    from haze.cli._core import cli

    for name in COMMAND_MODULES:
        importlib.import_module(name)
    return cli


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``haze`` command (the console-script entry point)."""
    try:
        import click  # noqa: F401
        import rich  # noqa: F401
    except ImportError:
        print(MISSING_DEPENDENCIES, file=sys.stderr)
        sys.exit(1)
    _configure_logging()
    get_cli().main(args=list(argv) if argv is not None else None, prog_name="haze")


def _configure_logging() -> None:
    # Job logs and haze's warnings must reach a worker's stderr; an app that set up
    # logging itself (e.g. in a job module) keeps its own handlers.
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        for handler in root.handlers:
            # queue:work prints haze's records itself; it skips only this handler.
            setattr(handler, _DEFAULT_HANDLER_FLAG, True)


#: Marks the root handler the CLI installed (not one the app configured).
_DEFAULT_HANDLER_FLAG = "_haze_cli_default"
