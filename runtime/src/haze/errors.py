"""The public path of :mod:`haze._kernel.errors`."""

from haze._kernel.errors import *  # noqa: F403
from haze._kernel.errors import __all__ as __all__
