"""The App as the engine and the layers above it see it: ``EngineApp``.

An ``AppView`` whose ``manager`` is this engine's ``QueueManager``. The engine never
names ``haze.App``; the composition root checks that an ``App`` is an ``EngineApp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from haze.contracts.app import AppView

if TYPE_CHECKING:
    from haze._engine.manager import QueueManager

__all__ = ["EngineApp"]

EngineApp: TypeAlias = "AppView[QueueManager]"
