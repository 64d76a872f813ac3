"""The public path of :mod:`haze._base.ids`."""

from haze._base.ids import *  # noqa: F403
from haze._base.ids import __all__ as __all__
