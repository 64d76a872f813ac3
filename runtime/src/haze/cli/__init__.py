"""The ``haze`` command line: ``haze make:job``, ``haze queue:work``, ``haze queue:failed``, …

Each command group lives in its own module and registers its commands on the root
group from :mod:`haze.cli._core` with ``@cli.command("group:name")``. A new group is a
new module plus one entry in :data:`COMMAND_MODULES`; nothing else changes.

click and rich come with the ``haze-jobs[cli]`` extra; the runtime itself stays
dependency-free. Without them this package still imports, so :func:`main` can say what
to install.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from haze._base.hints import install_hint
from haze.cli._logging import configure_logging

if TYPE_CHECKING:
    import click

try:
    from haze.cli._core import cli as _core_cli

    _root: click.Group | None = _core_cli
except ModuleNotFoundError as error:  # click or rich is missing: main() says what to install
    if (error.name or "").split(".")[0] not in ("click", "rich"):
        raise
    _root = None

__all__ = ["COMMAND_MODULES", "get_cli", "main"]

#: Modules whose import registers commands on the root group, in help order.
COMMAND_MODULES: tuple[str, ...] = (
    "haze.cli.init",
    "haze.cli.make",
    "haze.cli.db",
    "haze.cli.queue",
    "haze.cli.queue_failed",
    "haze.cli.queue_admin",
    "haze.cli.queue_stats",
    "haze.cli.queue_routes",
    "haze.cli.schedule",
    "haze.cli.workflow",
    "haze.cli.infra",
    "haze.cli.build",
    "haze.cli.dashboard",
)

MISSING_DEPENDENCIES = f"The haze CLI needs click and rich: {install_hint('cli')}"


def get_cli() -> click.Group:
    """The root ``haze`` group with every command module registered (for CliRunner)."""
    if _root is None:
        raise ModuleNotFoundError(MISSING_DEPENDENCIES)
    for name in COMMAND_MODULES:
        importlib.import_module(name)
    return _root


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``haze`` command (the console-script entry point)."""
    try:
        import click  # noqa: F401
        import rich  # noqa: F401
    except ImportError:
        print(MISSING_DEPENDENCIES, file=sys.stderr)
        sys.exit(1)
    configure_logging()
    get_cli().main(args=list(argv) if argv is not None else None, prog_name="haze")
