"""What the author of a driver, a store or a platform adapter builds on: one public path.

A queue driver implements ``haze.contracts.driver.Driver`` (a store
``haze.contracts.store.Store``) and registers through the ``haze.drivers`` or
``haze.stores`` entry points; a platform adapter (a Worker's ``queue()`` handler, a
Lambda's SQS handler, a scheduler's trigger) also runs delivered messages through the
engine, reads the platform's environment and dispatches schedules. Everything such a
package needs of haze beyond the contracts is here, under names that stay put while
haze's private modules move; ``haze_cloudflare``, ``haze_lambda`` and ``haze_infra`` use
nothing else.

Names load on first use, so importing this module costs a Worker's or a Lambda's cold
start nothing::

    from haze.driver_api import Delivery, Message, decode

======================  ==============================================================
names                   what they are for
======================  ==============================================================
``App``, ``run_in_app`` the app; run a block with it as the current app
``define_queue_config``  building an app's config in code (a Worker's default)
``define_haze_config``
``env``, ``env_source``  the app's environment; ``env_source`` makes ``env`` read a
                        platform's variables (a Worker's ``env``) inside a block
``env_duration``         a duration read from an environment variable
``parse_duration``       ``"30s"``/``"5m"``/seconds to seconds
``Message``, ``decode``  the message envelope, and the one parser of its JSON
``new_id_prefix``        start a new job-id prefix (a Worker's isolate, per request)
``Delivery``             run delivered messages through the engine: decode, run, settle
``DriverContext``        what a queue driver is handed when it is built:
                        ``cls(name, options, context)`` (never the App)
``Worker``               the pull-loop worker (a platform that polls)
``invocations``          the presence record of a platform's invocations
``dispatch_trigger``     dispatch the schedules a platform trigger stands for
``platform_triggers``    the triggers a platform needs for the app's schedules
``MISFIRE_GRACE``        how late a scheduled run may start
``register_plugin``      register a plugin in this process (a bundle without package
                        metadata): ``register_plugin("haze.stores", "kv", "m:KVStore")``
``ObjectStore``, ...     where large payloads are offloaded: the ``ObjectStore``
                        Protocol (``cls(url)``; async ``put``/``get``/``delete`` and
                        ``objects()`` of ``StoredObject``), registered by URL scheme in
                        the ``OFFLOAD_GROUP`` (``"haze.offload"``); ``OffloadError``
``Workflow``, ...        durable workflows for a platform's own engine: ``Workflow``,
                        ``find_workflow``, ``registered_workflows``, ``WorkflowRun``,
                        ``encode_result``, ``workflow_state`` and the Lambda run names
                        (``DISPATCH_SUB_TYPE``, ``operation_name``, ``shown_name``)
``ConfigError``, ...     the errors of ``haze.errors``
======================  ==============================================================
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from haze._app.app import App
    from haze._app.config import define_haze_config, define_queue_config, env, env_source
    from haze._app.env import env_duration
    from haze._base.current import run_in_app
    from haze._base.durations import parse_duration
    from haze._base.errors import (
        ConfigError,
        HazeError,
        MessageDecodeError,
        OffloadError,
        ScheduleError,
        WorkflowError,
        WorkflowRunError,
    )
    from haze._base.id_prefix import new_id_prefix
    from haze._base.message import Message, decode
    from haze._base.plugins import OFFLOAD as OFFLOAD_GROUP
    from haze._base.plugins import register as register_plugin
    from haze._orchestration.scheduling import MISFIRE_GRACE, dispatch_trigger, platform_triggers
    from haze._workers.delivery import Delivery
    from haze._workers.presence import invocations
    from haze._workers.worker import Worker
    from haze._workflows.api import Workflow
    from haze._workflows.definition import find_workflow, registered_workflows
    from haze._workflows.engine import workflow_state
    from haze._workflows.lambda_runs import DISPATCH_SUB_TYPE, operation_name, shown_name
    from haze._workflows.run import WorkflowRun, encode_result
    from haze.contracts.offload import ObjectStore, StoredObject
    from haze.drivers.context import DriverContext

__all__ = [
    "DISPATCH_SUB_TYPE",
    "MISFIRE_GRACE",
    "OFFLOAD_GROUP",
    "App",
    "ConfigError",
    "Delivery",
    "DriverContext",
    "HazeError",
    "Message",
    "MessageDecodeError",
    "ObjectStore",
    "OffloadError",
    "ScheduleError",
    "StoredObject",
    "Worker",
    "Workflow",
    "WorkflowError",
    "WorkflowRun",
    "WorkflowRunError",
    "decode",
    "define_haze_config",
    "define_queue_config",
    "dispatch_trigger",
    "encode_result",
    "env",
    "env_duration",
    "env_source",
    "find_workflow",
    "invocations",
    "new_id_prefix",
    "operation_name",
    "parse_duration",
    "platform_triggers",
    "register_plugin",
    "registered_workflows",
    "run_in_app",
    "shown_name",
    "workflow_state",
]

#: name -> (module, attribute): where each name lives today.
_HOMES: dict[str, tuple[str, str]] = {
    "App": ("haze._app.app", "App"),
    "run_in_app": ("haze._base.current", "run_in_app"),
    "define_haze_config": ("haze._app.config", "define_haze_config"),
    "define_queue_config": ("haze._app.config", "define_queue_config"),
    "env": ("haze._app.config", "env"),
    "env_source": ("haze._app.config", "env_source"),
    "env_duration": ("haze._app.env", "env_duration"),
    "parse_duration": ("haze._base.durations", "parse_duration"),
    "ConfigError": ("haze._base.errors", "ConfigError"),
    "HazeError": ("haze._base.errors", "HazeError"),
    "MessageDecodeError": ("haze._base.errors", "MessageDecodeError"),
    "ScheduleError": ("haze._base.errors", "ScheduleError"),
    "Message": ("haze._base.message", "Message"),
    "decode": ("haze._base.message", "decode"),
    "new_id_prefix": ("haze._base.id_prefix", "new_id_prefix"),
    "register_plugin": ("haze._base.plugins", "register"),
    "OFFLOAD_GROUP": ("haze._base.plugins", "OFFLOAD"),
    "OffloadError": ("haze._base.errors", "OffloadError"),
    "ObjectStore": ("haze.contracts.offload", "ObjectStore"),
    "StoredObject": ("haze.contracts.offload", "StoredObject"),
    "MISFIRE_GRACE": ("haze._orchestration.scheduling", "MISFIRE_GRACE"),
    "dispatch_trigger": ("haze._orchestration.scheduling", "dispatch_trigger"),
    "platform_triggers": ("haze._orchestration.scheduling", "platform_triggers"),
    "Delivery": ("haze._workers.delivery", "Delivery"),
    "invocations": ("haze._workers.presence", "invocations"),
    "Worker": ("haze._workers.worker", "Worker"),
    "Workflow": ("haze._workflows.api", "Workflow"),
    "find_workflow": ("haze._workflows.definition", "find_workflow"),
    "registered_workflows": ("haze._workflows.definition", "registered_workflows"),
    "WorkflowRun": ("haze._workflows.run", "WorkflowRun"),
    "encode_result": ("haze._workflows.run", "encode_result"),
    "workflow_state": ("haze._workflows.engine", "workflow_state"),
    "DISPATCH_SUB_TYPE": ("haze._workflows.lambda_runs", "DISPATCH_SUB_TYPE"),
    "operation_name": ("haze._workflows.lambda_runs", "operation_name"),
    "shown_name": ("haze._workflows.lambda_runs", "shown_name"),
    "WorkflowError": ("haze._base.errors", "WorkflowError"),
    "WorkflowRunError": ("haze._base.errors", "WorkflowRunError"),
    "DriverContext": ("haze.drivers.context", "DriverContext"),
}


def __getattr__(name: str) -> _typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home[0]), home[1])
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
