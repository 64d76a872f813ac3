"""The logging the ``haze`` command sets up (no click: :func:`haze.cli.main` runs it first)."""

from __future__ import annotations

import logging

__all__ = ["DEFAULT_HANDLER_FLAG", "configure_logging"]

#: Marks the root handler the CLI installed (not one the app configured).
DEFAULT_HANDLER_FLAG = "_haze_cli_default"


def configure_logging() -> None:
    # Job logs and haze's warnings must reach a worker's stderr; an app that set up
    # logging itself (e.g. in a job module) keeps its own handlers.
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        for handler in root.handlers:
            # queue:work prints haze's records itself; it skips only this handler.
            setattr(handler, DEFAULT_HANDLER_FLAG, True)
