"""The public path of :mod:`haze._base.errors`."""

from haze._base.errors import *  # noqa: F403
from haze._base.errors import __all__ as __all__
