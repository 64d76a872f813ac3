"""The generated Cloudflare entry: ``dist/cloudflare/src/entry.py`` of the bundled app."""

from haze_cloudflare import QueueWorker

from . import ROOT


class Default(QueueWorker):
    app_root = ROOT


Default.preload()
