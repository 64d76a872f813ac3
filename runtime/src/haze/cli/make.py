"""``make:*`` commands: write new source files from templates under the app root."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import click

from haze.cli._core import State, cli, console

__all__ = ["job_name", "job_path", "make_job", "snake_case"]

_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

JOB_TEMPLATE = """\
from typing import Any

from haze import JobContext, define_job


@define_job({name}tries=3, backoff=[10, 60])
async def {function}(payload: dict[str, Any], job: JobContext) -> None:
    # `haze queue:work` prints WARNING and above; job.logger.info lines need -v.
    job.logger.warning("{function} running (attempt %s)", job.attempt)
"""


def snake_case(name: str) -> str:
    """``SendInvoice`` → ``send_invoice``; ``HTTPPing`` → ``http_ping``; ``send-invoice`` too."""
    return _BOUNDARY.sub("_", name).replace("-", "_").lower()


def job_path(root: Path, name: str) -> tuple[Path, str]:
    """Where ``make:job NAME`` writes and the handler's name. ``admin/Cleanup`` nests
    (its job is named ``admin.cleanup``: see :func:`job_name`).

    Raises ``click.BadParameter`` for a name that cannot become a Python module.
    """
    segments = name.replace("\\", "/").split("/")
    modules: list[str] = []
    for segment in segments:
        if not _SEGMENT.match(segment):
            raise click.BadParameter(
                f"{name!r} is not a job name: use letters, digits and underscores, starting "
                "with a letter (e.g. SendInvoice, or admin/Cleanup for a subfolder)",
                param_hint="'NAME'",
            )
        module = snake_case(segment)
        if keyword.iskeyword(module) or not module.isidentifier():
            raise click.BadParameter(
                f"{name!r} gives the module name {module!r}, a Python keyword; pick another name",
                param_hint="'NAME'",
            )
        modules.append(module)
    path = root.joinpath("app", "job", *modules[:-1], f"{modules[-1]}.py")
    return path, modules[-1]


def job_name(root: Path, path: Path) -> str:
    """The job name of a module ``make:job`` writes: its function's name at the top of
    app/job/, its dotted path below it (``admin.cleanup``), so that a job made in a
    subfolder never takes the name of one elsewhere (two jobs of one name stop the app)."""
    parts = path.relative_to(root / "app" / "job").with_suffix("").parts
    return ".".join(parts)


@cli.command("make:job", short_help="Write a new job module under app/job/.")
@click.argument("name")
@click.option("--force", is_flag=True, help="Overwrite the file if it exists.")
@click.pass_obj
def make_job(state: State, name: str, force: bool) -> None:
    """Write app/job/<name>.py with a job definition (SendInvoice → send_invoice.py)."""
    path, function = job_path(state.root, name)
    if path.exists() and not force:
        raise click.ClickException(f"{path} already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    job = job_name(state.root, path)
    named = "" if job == function else f'name="{job}", '
    path.write_text(JOB_TEMPLATE.format(function=function, name=named), encoding="utf-8")
    console().print(f"Job written to {path}", markup=False)
