"""haze infra: Pulumi components that deploy a haze app, configured from the app itself.

::

    import pulumi
    from haze_infra import HazeAwsApp, HazeCloudflareApp, stack_config

    stack = stack_config("..")          # the app's config/queue.py and jobs
    HazeAwsApp("jobs", stack=stack)     # SQS + DLQ + Lambda consumer per sqs connection
    HazeCloudflareApp("edge", stack=stack, account_id=pulumi.Config().require("accountId"))

``haze_infra.config`` (what ``haze infra:config`` prints) imports no Pulumi, and a
plain ``pip install haze-infra`` installs none; the components load ``pulumi_aws`` /
``pulumi_cloudflare`` only when first used, from the ``aws`` / ``cloudflare`` extras.
"""

from __future__ import annotations

import importlib
from typing import Any

from haze_infra.config import InfraConfigError, StackConfig, load_app, stack_config

__all__ = [
    "ContainerSettings",
    "HazeAwsApp",
    "HazeCloudflareApp",
    "HazeCloudflareQueue",
    "HazeCloudflareWorker",
    "HazeContainerWorker",
    "HazeDrainSchedule",
    "HazeLambdaConsumer",
    "HazeSqsQueue",
    "InfraConfigError",
    "StackConfig",
    "load_app",
    "stack_config",
]

_LAZY = {
    "ContainerSettings": "aws",
    "HazeAwsApp": "aws",
    "HazeContainerWorker": "aws",
    "HazeDrainSchedule": "aws",
    "HazeLambdaConsumer": "aws",
    "HazeSqsQueue": "aws",
    "HazeCloudflareApp": "cloudflare",
    "HazeCloudflareQueue": "cloudflare",
    "HazeCloudflareWorker": "cloudflare",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'haze_infra' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("pulumi"):
            raise
        raise InfraConfigError(
            f"{name} needs Pulumi ({e.name} is not installed): pip install 'haze-infra[{module}]'"
        ) from None
    return getattr(loaded, name)
