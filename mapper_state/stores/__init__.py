"""The registry of stores: which module opens which URI scheme, and every store's settings.

Built-in stores are listed in :data:`BUILTIN`; third-party stores register a
:class:`~mapper_state.stores.base.StoreType` through the ``mapper_state.stores``
entry-point group (a plain ``from_uri(location, options)`` callable is accepted too,
as a store with no settings). A store's declaration is imported to list its
settings; its implementation (and its SDK) only when its scheme is used, so the
cloud SDKs cost nothing to a local run.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from mapper_state.errors import ConfigError
from mapper_state.settings import Settings, SettingSpec
from mapper_state.stores.base import BlobStore, Opener, StoreType
from mapper_state.stores.guard import guarded

ENTRY_POINT_GROUP = "mapper_state.stores"
#: The modules whose ``STORE`` declares a built-in store.
BUILTIN = (
    "mapper_state.stores.file",
    "mapper_state.stores.memory",
    "mapper_state.stores.s3",
    "mapper_state.stores.azure",
    "mapper_state.stores.gcs",
    "mapper_state.stores.postgres",
)


def builtin_store_types() -> tuple[StoreType, ...]:
    """The stores that ship with mapper-state: the generated files list these only, so that
    they do not depend on what else is installed."""
    return tuple(importlib.import_module(name).STORE for name in BUILTIN)


@functools.cache
def store_types() -> tuple[StoreType, ...]:
    """Every store: the built-in ones, then those registered through the entry-point group."""
    found = list(builtin_store_types())
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        if isinstance(loaded, StoreType):
            found.append(loaded)
        elif callable(loaded):
            found.append(StoreType(section=ep.name, schemes=(ep.name,), opener=loaded))
    return tuple(found)


def store_settings(stores: Iterable[StoreType] | None = None) -> tuple[SettingSpec, ...]:
    """Every store's settings (of ``stores``, default all), by their full names
    ``state_backend.<section>.<name>``."""
    return tuple(
        dataclasses.replace(spec, name=f"state_backend.{store.section}.{spec.name}")
        for store in (store_types() if stores is None else stores)
        for spec in store.settings
    )


def split_uri(uri: str) -> tuple[str, str]:
    """``("s3", "bucket/prefix")`` for ``s3://bucket/prefix``; a bare path is a ``file`` URI.

    ``file:relative/path`` (no slashes after the colon) is a relative path too.
    """
    scheme, sep, location = uri.partition("://")
    if not sep:
        return "file", uri.removeprefix("file:")
    return scheme.lower(), location


def store_type(scheme: str) -> StoreType:
    """The store that serves ``scheme``; an unknown scheme is a config error."""
    for store in store_types():
        if scheme in store.schemes:
            return store
    known = ", ".join(sorted({s for store in store_types() for s in store.schemes}))
    raise ConfigError(f"state_backend.uri has an unknown scheme {scheme}:// (known: {known})")


def _opener(store: StoreType, scheme: str) -> Opener:
    if not isinstance(store.opener, str):
        return store.opener
    module_name, _, function = store.opener.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (pip install 'mapper-state[{store.extra}]')" if store.extra else ""
        raise ConfigError(
            f"state_backend.uri uses {scheme}:// but its library is missing: {exc.name}{hint}"
        ) from None
    opener: Opener = getattr(module, function)
    return opener


def open_store(
    uri: str,
    options_for: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    retry_deadline_seconds: float | None = None,
) -> BlobStore:
    """The store a ``state_backend.uri`` names, configured with its section's settings.

    A store that retries (``StoreType.retries``) is opened with ``retry_deadline_seconds``
    when given: no call of it, retries included, lasts longer (its own limit otherwise).
    It comes :func:`~mapper_state.stores.guard.guarded`: no call of it is sent once the
    caller's deadline has passed, whatever the store.
    """
    scheme, location = split_uri(uri)
    store = store_type(scheme)
    opener = _opener(store, scheme)
    options = (options_for or {}).get(store.section, {})
    if store.retries and retry_deadline_seconds is not None:
        # a store that declares ``retries`` says its opener takes the keyword (base.py, 7.)
        retrying: Callable[..., BlobStore] = opener
        return guarded(retrying(location, options, retry_deadline_seconds=retry_deadline_seconds))
    return guarded(opener(location, options))


def open_configured_store(settings: Settings) -> BlobStore:
    """The store the resolved settings name.

    A store that retries transient failures is opened with a third of the lease's TTL
    as the limit of each call: a state write or a lease read made by a run never
    outlasts the lease it holds by much. A caller that needs a call to end sooner (a
    renewal, before the lease expires) gives it a deadline of its own
    (:mod:`mapper_state.stores.deadline`).
    """
    return open_store(
        settings.uri,
        {s.section: settings.section(s.section) for s in store_types()},
        retry_deadline_seconds=settings.lock_timeout / 3,
    )
