"""What this adapter adds to haze, by name (see ``haze.driver_api.register_plugin``).

The same table is declared as entry points in ``pyproject.toml`` (a test checks the two
agree), which is how an installed haze finds it. A Worker bundle vendors the packages
without their ``.dist-info``, so no entry point is found there: the table is registered
in this process instead, by ``_js.register_plugins()`` at the first request
(``bind_env``) and when ``QueueWorker`` builds its app. Not at import: an isolate's cold
start does not load the plugin registry. Targets are ``"module:attribute"`` strings,
imported on first use.
"""

from __future__ import annotations

import haze.driver_api as _api

__all__ = ["PLUGINS", "register"]

#: (entry point group, name) -> target
PLUGINS: dict[tuple[str, str], str] = {
    ("haze.stores", "kv"): "haze_cloudflare.kv:KVStore",
    ("haze.bindings", "cloudflare"): "haze_cloudflare.driver:binding_producer",
    ("haze.bindings", "d1"): "haze_cloudflare.d1:binding_executor",
    ("haze.bindings", "workflows"): "haze_cloudflare.workflows:binding_workflow",
    ("haze.offload", "r2"): "haze_cloudflare.r2:R2ObjectStore",
}


_registered = False


def register() -> None:
    """Register every plugin of the table in this process (once; idempotent)."""
    global _registered
    if _registered:
        return
    for (group, name), target in PLUGINS.items():
        _api.register_plugin(group, name, target)
    _registered = True
