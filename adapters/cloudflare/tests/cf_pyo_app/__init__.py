"""A tiny haze app, shipped as a wheel into Pyodide by test_cf_pyodide.py.

Laid out like the bundle of ``haze build --preset cloudflare``: ``config/*.py``,
``app/job/*.py`` and ``entry.py`` (the generated Worker entry) under one root.
"""

import os

ROOT = os.path.dirname(os.path.abspath(__file__))
