"""``haze infra:config``: the values a deploy stack needs, derived from the app.

It prints, per connection of ``config/queue.py``, what the ``haze_infra`` Pulumi
components derive from it (queue names, the most ``tries`` and the longest
``timeout`` of the jobs that can land there, SQS redrive/visibility/Lambda timeout,
Cloudflare consumer settings), the D1/KV bindings, and the environment variables the
config reads (names only, never values). The derivation lives in ``haze_infra.config``
(the ``haze-infra`` package), which imports no Pulumi.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from haze.build import install_hint
from haze.cli._core import State, cli

__all__ = ["infra_config"]


def _missing() -> str:
    return f"haze infra:config needs the haze-infra package: {install_hint(package='haze_infra')}"


def _derive(state: State) -> Any:
    try:
        config = importlib.import_module("haze_infra.config")
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("haze_infra"):
            raise click.ClickException(_missing()) from None
        raise
    return config, config.stack_config(state.root)


@cli.command("infra:config")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people, json for a stack or a script.",
)
@click.option(
    "--connection",
    "connections",
    multiple=True,
    metavar="NAME",
    help="Only this connection (repeatable).",
)
@click.pass_obj
def infra_config(state: State, fmt: str, connections: tuple[str, ...]) -> None:
    """Print the infrastructure settings derived from config/queue.py and the jobs."""
    config, stack = _derive(state)
    if connections:
        for name in connections:
            stack.connection(name)  # raises naming the known connections
        from dataclasses import replace

        stack = replace(
            stack, connections={n: c for n, c in stack.connections.items() if n in connections}
        )
    if fmt == "json":
        click.echo(json.dumps(stack.to_dict(), indent=2, sort_keys=False))
        for warning in stack.warnings:
            click.echo(f"warning: {warning}", err=True)
    else:
        click.echo(config.format_text(stack))
    sys.stdout.flush()
