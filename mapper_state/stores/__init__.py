"""Choose a store by URI scheme; third-party stores register through an entry-point group.

A store module exposes ``from_uri(location, options) -> BlobStore`` where
``location`` is the URI without its ``scheme://`` and ``options`` are the
``state_backend.<scheme>.*`` settings. Modules are imported only when their
scheme is used, so the cloud SDKs cost nothing to a local run.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from mapper_state.errors import ConfigError
from mapper_state.stores.base import BlobStore

ENTRY_POINT_GROUP = "mapper_state.stores"

# scheme -> (module, settings section, extra to install)
BUILTIN_SCHEMES: dict[str, tuple[str, str, str | None]] = {
    "file": ("mapper_state.stores.file", "file", None),
    "memory": ("mapper_state.stores.memory", "memory", None),
    "s3": ("mapper_state.stores.s3", "s3", "s3"),
    "azure": ("mapper_state.stores.azure", "azure", "azure"),
    "az": ("mapper_state.stores.azure", "azure", "azure"),
    "gs": ("mapper_state.stores.gcs", "gcs", "gcs"),
    "gcs": ("mapper_state.stores.gcs", "gcs", "gcs"),
}


def split_uri(uri: str) -> tuple[str, str]:
    """``("s3", "bucket/prefix")`` for ``s3://bucket/prefix``; a bare path is a ``file`` URI.

    ``file:relative/path`` (no slashes after the colon) is a relative path too.
    """
    scheme, sep, location = uri.partition("://")
    if not sep:
        return "file", uri.removeprefix("file:")
    return scheme.lower(), location


def open_store(uri: str, options_for: dict[str, dict[str, Any]] | None = None) -> BlobStore:
    """The store a ``state_backend.uri`` names, configured with its scheme's settings."""
    scheme, location = split_uri(uri)
    options_for = options_for or {}
    if scheme in BUILTIN_SCHEMES:
        module_name, section, extra = BUILTIN_SCHEMES[scheme]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = f" (pip install 'mapper-state[{extra}]')" if extra else ""
            raise ConfigError(
                f"state_backend.uri uses {scheme}:// but its library is missing: {exc.name}{hint}"
            ) from None
        return module.from_uri(location, options_for.get(section, {}))
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep.load()(location, options_for.get(scheme, {}))
    known = ", ".join(
        sorted({*BUILTIN_SCHEMES, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
    )
    raise ConfigError(f"state_backend.uri has an unknown scheme {scheme}:// (known: {known})")


def open_configured_store(settings: Any) -> BlobStore:
    """The store the resolved settings name.

    A store that retries transient failures gives up within a third of the lease's
    TTL, so that a renewal stuck in retries cannot outlive the lease it renews.
    """
    store = open_store(
        settings.uri,
        {section: settings.backend_options(section) for section in ("s3", "azure", "gcs")},
    )
    if hasattr(store, "retry_deadline_seconds"):
        store.retry_deadline_seconds = min(store.retry_deadline_seconds, settings.lock_timeout / 3)
    return store
