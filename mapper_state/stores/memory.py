"""An in-process store for tests and for ``doctor``'s own self-check.

``memory://NAME`` names one store shared by everything in the process.
``memory://NAME?ignore_conditions=true`` behaves like an S3-compatible store that
accepts but ignores conditional headers: the case ``doctor`` must catch;
``?ignore_delete_conditions=true`` only ignores them on deletes (MinIO, Ceph RGW,
fake-gcs-server), where release must not rely on them.
``memory://NAME?latency_ms=500`` makes every request take that long, so the
benchmarks can show that a slow store does not slow the stream.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs

from mapper_state.stores.base import (
    Blob,
    BlobStore,
    Entry,
    PreconditionFailed,
    StoreTraits,
    StoreType,
)

_STORES: dict[str, MemoryStore] = {}
_REGISTRY_LOCK = threading.Lock()


class MemoryStore:
    """A dict of key to (bytes, version) behind a lock."""

    def __init__(
        self,
        name: str = "",
        *,
        ignore_conditions: bool = False,
        ignore_delete_conditions: bool = False,
        latency: float = 0.0,
    ) -> None:
        self.name = name
        self.ignore_conditions = ignore_conditions
        self.ignore_delete_conditions = ignore_delete_conditions or ignore_conditions
        self.latency = latency
        self._objects: dict[str, Blob] = {}
        self._modified: dict[str, float] = {}
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self.requests = 0
        self.traits = StoreTraits(enforces_delete_conditions=not self.ignore_delete_conditions)

    @property
    def display_uri(self) -> str:
        return f"memory://{self.name}"

    def close(self) -> None:
        """Nothing to release."""

    def _wait(self, key: str) -> None:
        if self.latency:
            time.sleep(self.latency)

    def _new_version(self) -> str:
        return str(next(self._counter))

    def read(self, key: str) -> Blob | None:
        self._wait(key)
        with self._lock:
            self.requests += 1
            return self._objects.get(key)

    def create(self, key: str, data: bytes) -> str:
        self._wait(key)
        with self._lock:
            self.requests += 1
            if key in self._objects and not self.ignore_conditions:
                raise PreconditionFailed(f"{key} already exists")
            version = self._new_version()
            self._objects[key] = Blob(bytes(data), version)
            self._modified[key] = time.time()
            return version

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        self._wait(key)
        with self._lock:
            self.requests += 1
            current = self._objects.get(key)
            if not self.ignore_conditions and (current is None or current.version != if_version):
                raise PreconditionFailed(f"{key} changed since version {if_version}")
            version = self._new_version()
            self._objects[key] = Blob(bytes(data), version)
            self._modified[key] = time.time()
            return version

    def delete(self, key: str, if_version: str | None = None) -> None:
        self._wait(key)
        with self._lock:
            self.requests += 1
            current = self._objects.get(key)
            if (
                if_version is not None
                and not self.ignore_delete_conditions
                and (current is None or current.version != if_version)
            ):
                raise PreconditionFailed(f"{key} changed since version {if_version}")
            self._objects.pop(key, None)
            self._modified.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[str]:
        for entry in self.list_entries(prefix):
            yield entry.key

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        self._wait(prefix)
        with self._lock:
            self.requests += 1
            entries = [
                Entry(k, self._modified.get(k))
                for k in sorted(self._objects)
                if k.startswith(prefix) and not (exclude and k.startswith(exclude))
            ]
        yield from entries


def from_uri(location: str, options: Mapping[str, Any]) -> MemoryStore:
    name, _, query = location.partition("?")
    params = parse_qs(query)

    def flag(name: str) -> bool:
        return params.get(name, ["false"])[-1].lower() in ("1", "true", "yes")

    ignore = flag("ignore_conditions")
    latency = float(params.get("latency_ms", ["0"])[-1]) / 1000
    with _REGISTRY_LOCK:
        store = _STORES.get(location)
        if store is None:
            store = _STORES[location] = MemoryStore(
                name,
                ignore_conditions=ignore,
                ignore_delete_conditions=flag("ignore_delete_conditions"),
                latency=latency,
            )
        return store


STORE = StoreType(
    section="memory",
    schemes=("memory",),
    opener=from_uri,
    description="`memory://name`: in this process only, for tests "
    "(`?ignore_conditions=true`, `?latency_ms=N`).",
)


# What the type checker proves: the class serves the store interface.
_STORE: type[BlobStore] = MemoryStore
