"""What this adapter adds to haze, by name (see ``haze.driver_api.register_plugin``).

The same table is declared as entry points in ``pyproject.toml`` (a test checks the two
agree), which is how an installed haze finds it. A Worker bundle vendors the packages
without their ``.dist-info``, so no entry point is found there: importing ``_js`` (every
path into a Worker does: ``QueueWorker``, ``bind_env``) registers the table in this
process instead. Targets are ``"module:attribute"`` strings, imported on first use, so
registering costs no cold start.
"""

from __future__ import annotations

from haze.driver_api import register_plugin

__all__ = ["PLUGINS", "register"]

#: (entry point group, name) -> target
PLUGINS: dict[tuple[str, str], str] = {
    ("haze.stores", "kv"): "haze_cloudflare.kv:KVStore",
    ("haze.bindings", "cloudflare"): "haze_cloudflare.driver:binding_producer",
    ("haze.bindings", "d1"): "haze_cloudflare.d1:binding_executor",
    ("haze.offload", "r2"): "haze_cloudflare.r2:R2ObjectStore",
}


def register() -> None:
    """Register every plugin of the table in this process (idempotent)."""
    for (group, name), target in PLUGINS.items():
        register_plugin(group, name, target)
