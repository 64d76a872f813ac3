"""The public path of :mod:`haze._engine.otel`."""

from haze._engine.otel import *  # noqa: F403
from haze._engine.otel import __all__ as __all__
