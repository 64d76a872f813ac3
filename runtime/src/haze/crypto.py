"""The public path of :mod:`haze._base.crypto`."""

from haze._base.crypto import *  # noqa: F403
from haze._base.crypto import __all__ as __all__
