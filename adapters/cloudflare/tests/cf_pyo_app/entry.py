"""The generated Cloudflare entry: ``dist/cloudflare/src/entry.py`` of the bundled app."""

from haze_cloudflare import QueueWorker

from . import ROOT


class Default(QueueWorker):
    app_root = ROOT


# Imports and job discovery at the top level: a deployed Worker snapshots them.
Default.preload()
