"""The Cloudflare Workflows part of ``haze build --preset cloudflare``: one
``WorkflowEntrypoint`` class per workflow of a ``"workflows": "native"`` cloudflare
connection in ``src/entry.py`` and its ``workflows`` entry in ``wrangler.json``.

``onboard`` -> class ``OnboardWorkflow``, binding ``HAZE_WF_ONBOARD``, Workflow name
``onboard``. A workflow Cloudflare cannot take as it is (a name outside
``[A-Za-z0-9_-]``, or over 64 characters; two names making one class; ``tries`` > 1,
whole-run replays that Cloudflare does not do) stops the build with one line.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from haze._base.errors import ConfigError
from haze._workflows.definition import registered_workflows

if TYPE_CHECKING:
    from haze.build import BuildContext

__all__ = ["native_workflows", "workflow_binding", "workflow_class", "workflow_classes"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def workflow_class(name: str) -> str:
    """``onboard`` -> ``OnboardWorkflow``; ``send-receipt`` -> ``SendReceiptWorkflow``."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    text = "".join(p[:1].upper() + p[1:] for p in parts)
    return f"{'W' if text[:1].isdigit() else ''}{text}Workflow"


def workflow_binding(name: str) -> str:
    """``onboard`` -> ``HAZE_WF_ONBOARD``."""
    return "HAZE_WF_" + re.sub(r"[^A-Z0-9]+", "_", name.upper()).strip("_")


def native_workflows(ctx: BuildContext) -> list[str]:
    """The workflows of the app's native cloudflare connections (checked), by name."""
    app = ctx.app
    connections = app.queue_config.connections
    native = {
        n
        for n, o in connections.items()
        if o.get("driver") == "cloudflare" and o.get("workflows") == "native"
    }
    if not native:
        return []
    app.discover()
    names: list[str] = []
    classes: dict[str, str] = {}
    for name, wf in sorted(registered_workflows().items()):
        conn = app.queue_config.routes.connection_for(wf.job.name, wf.job.connection)
        if (conn or app.queue_config.default) not in native:
            continue
        where = f'workflow "{name}" ({wf.job.origin})'
        if not _NAME.fullmatch(name):
            _refuse(f"{where}: Cloudflare Workflows names are 1-64 of A-Z a-z 0-9 _ -; rename it")
        if wf.job.tries > 1:
            _refuse(
                f"{where}: tries={wf.job.tries} replays the whole run after an error outside "
                "its steps, which Cloudflare Workflows do not do; retry the steps instead "
                '(run.step(..., tries=3)) or run it on haze\'s engine ("workflows": "store")'
            )
        cls = workflow_class(name)
        if cls in classes:
            _refuse(f'{where}: its class {cls} is also workflow "{classes[cls]}"\'s; rename one')
        classes[cls] = name
        names.append(name)
    return names


def _refuse(message: str) -> None:
    raise ConfigError(message, key="--preset")


def workflow_classes(names: list[str]) -> str:
    """The ``src/entry.py`` lines of the workflow classes (appended to the Worker's)."""
    if not names:
        return ""
    lines = [
        "",
        "",
        "# Cloudflare Workflows: one class per workflow of a native cloudflare connection",
        "from haze_cloudflare.workflows import HazeWorkflow  # noqa: E402",
    ]
    for name in names:
        lines += [
            "",
            "",
            f"class {workflow_class(name)}(HazeWorkflow):",
            f"    workflow = {name!r}",
            "    app_root = APP_ROOT",
        ]
    return "\n".join(lines) + "\n"


def wrangler_workflows(names: list[str]) -> list[dict[str, Any]]:
    """The ``workflows`` entries of ``wrangler.json``."""
    return [
        {"name": n, "binding": workflow_binding(n), "class_name": workflow_class(n)} for n in names
    ]
