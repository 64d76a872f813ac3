"""The public path of :mod:`haze._kernel.ids`."""

from haze._kernel.ids import *  # noqa: F403
from haze._kernel.ids import __all__ as __all__
