"""``haze build --preset NAME [--out DIR]``: turn the app into a deployable entrypoint.

The presets are :data:`haze.build.PRESETS` (``cloudflare``, ``aws-lambda``, ``docker``,
``server``, ``vercel``); each writes ``<out>/<preset>/`` (default ``<root>/dist``) and,
where its platform wants a file beside it, e.g. ``<out>/wrangler.json`` or
``<out>/aws-lambda.zip``. The command prints what was written and what is left to the
user (queues to create, packages to add, how to deploy).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from haze.build import PRESETS, BuildResult
from haze.build import build as run_build
from haze.cli._core import State, cli, console

__all__ = ["build_command"]


def _preset(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value not in PRESETS:
        raise click.BadParameter(
            f"unknown preset {value!r}; choose one of: {', '.join(PRESETS)}", ctx, param
        )
    return value


@cli.command("build")
@click.option(
    "--preset",
    required=True,
    metavar="NAME",
    callback=_preset,
    help=f"What to build: {', '.join(PRESETS)}.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The output directory (default: <root>/dist).",
)
@click.pass_obj
def build_command(state: State, preset: str, out: Path | None) -> None:
    """Build the app for a platform: cloudflare, aws-lambda, docker, server or vercel."""
    con = console()
    with con.status(f"building the {preset} preset of {state.root} …"):
        result = run_build(state.root, preset, out)
    _report(result)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _report(result: BuildResult) -> None:
    con = console()
    out = result.path.parent
    con.print(f"[green]built[/green] {result.preset} → {escape(_shown(result.path))}")
    # One line per top-level entry of the output directory, with its file count: the
    # preset's own directory and whatever the platform wants beside it.
    counts: dict[str, int] = {}
    for f in result.files:
        try:
            top = f.relative_to(out).parts[0]
        except ValueError:
            top = str(f)
        counts[top] = counts.get(top, 0) + 1
    for top, count in sorted(counts.items()):
        path = out / top
        if path.is_dir():
            con.print(f"  {escape(_shown(path))}/ ({count} file{'s' if count != 1 else ''})")
        else:
            con.print(f"  {escape(_shown(path))}")
    for note in result.notes:
        style = "yellow" if note.startswith("warning:") else "dim"
        con.print(f"[{style}]• {escape(note)}[/{style}]", soft_wrap=True)
