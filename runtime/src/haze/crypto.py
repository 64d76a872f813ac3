"""The public path of :mod:`haze._kernel.crypto`."""

from haze._kernel.crypto import *  # noqa: F403
from haze._kernel.crypto import __all__ as __all__
