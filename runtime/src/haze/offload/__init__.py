"""Object stores for offloaded payloads, found by the URL's scheme.

``file://`` (a local folder) and ``s3://`` (boto3, ``haze-jobs[sqs]``) are built in; a
package adds a scheme (``haze_cloudflare`` adds ``r2``) through the ``haze.offload``
entry points, or ``register_plugin("haze.offload", "r2", "module:Class")`` in a bundle
without package metadata. A class is built as ``cls(url)``, with no I/O, and satisfies
``haze.contracts.offload.ObjectStore``.

>>> object_store("file:///var/haze/offload").url
'file:///var/haze/offload'
"""

from __future__ import annotations

from urllib.parse import urlsplit

from haze._base.errors import ConfigError
from haze._base.plugins import OFFLOAD, Registry
from haze.contracts.offload import ObjectStore

__all__ = ["OBJECT_STORES", "object_store", "url_error"]

OBJECT_STORES = Registry(
    OFFLOAD,
    {
        "file": ("haze.offload.file", "FileObjectStore"),
        "s3": ("haze.offload.s3", "S3ObjectStore"),
    },
    taken="the offload scheme {name!r} is built in",
    what="offloading to {name}://",
    unknown=(
        "no object store handles {subject!r} (schemes known here: {known}); use "
        "s3://bucket/prefix, file:///absolute/folder, or install the package that adds "
        "the scheme (r2://BINDING/prefix needs haze-jobs[cloudflare])"
    ),
)

_stores: dict[str, ObjectStore] = {}


def url_error(url: object) -> str | None:
    """Why ``url`` cannot name an object store (None: it can; its scheme is checked
    when it is resolved)."""
    if not isinstance(url, str) or not url:
        return f"expected a URL such as s3://bucket/prefix or file:///var/haze, got {url!r}"
    parts = urlsplit(url)
    if not parts.scheme or (parts.scheme != "file" and not parts.netloc):
        return f"{url!r} is not a URL such as s3://bucket/prefix or file:///var/haze"
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        return f"{url!r}: a file:// URL names an absolute folder (file:///var/haze)"
    return None


def object_store(url: str, *, source: str = "", key: str = "") -> ObjectStore:
    """The store ``url`` names (one per URL in this process), or ``ConfigError`` at
    ``source``/``key`` saying what is wrong with it."""
    store = _stores.get(url)
    if store is None:
        problem = url_error(url)
        if problem is not None:
            raise ConfigError(problem, source=source, key=key)
        scheme = urlsplit(url).scheme
        cls = OBJECT_STORES.load(scheme, source=source, key=key, subject=url)
        try:
            store = cls(url)
        except ValueError as e:  # a store says what in its URL it cannot use
            raise ConfigError(str(e), source=source, key=key) from None
        if not isinstance(store, ObjectStore):
            raise ConfigError(
                f"the {scheme}:// store {type(store).__name__} lacks put/get/delete/objects",
                source=source,
                key=key,
            )
        _stores[url] = store
    return store
