"""A haze app with schedules, shipped as a wheel into Pyodide by test_cf_scheduled.py;
laid out like the bundle of ``haze build --preset cloudflare``."""

import os

ROOT = os.path.dirname(os.path.abspath(__file__))
