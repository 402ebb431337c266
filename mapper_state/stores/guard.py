"""The rule every store keeps, kept once above them: nothing is sent after the caller's deadline.

A caller that needs a store call to end by a given moment carries a deadline into it
(:mod:`mapper_state.stores.deadline`); a lease renewal asked for after the lease was given
up must not reach the store. The registry hands out every store it opens inside a
:class:`Guarded`, which refuses a call once that deadline has passed
(:class:`~mapper_state.stores.deadline.DeadlinePassed`, nothing sent) and otherwise
passes it on unchanged. So a store, built-in or third-party, keeps only what only it can
do: cut its SDK's own timeouts to ``deadline.seconds_left(...)``, and, where one call
sends several requests (retries, a read-back), check before each of them as
:class:`~mapper_state.stores.cloud.CloudStore` does.

Anything else of the store (its client, its root) is reached through the guard as on the
store itself; :attr:`Guarded.store` is the store it guards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mapper_state.stores import deadline
from mapper_state.stores.base import Blob, BlobStore, Entry, StoreTraits, listing


class Guarded:
    """A store whose every call is refused once the caller's deadline has passed."""

    #: Nothing else is set on a guard: setting a store's attribute through it fails loudly
    #: instead of changing nothing (set it on :attr:`store`).
    __slots__ = ("store",)

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    @property
    def traits(self) -> StoreTraits:
        return self.store.traits

    @property
    def display_uri(self) -> str:
        return self.store.display_uri

    def _check(self, op: str, key: str) -> None:
        deadline.check(f"{op} {self.store.display_uri}/{key}")

    def read(self, key: str) -> Blob | None:
        self._check("read", key)
        return self.store.read(key)

    def create(self, key: str, data: bytes) -> str:
        self._check("create", key)
        return self.store.create(key, data)

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        self._check("replace", key)
        return self.store.replace(key, data, if_version)

    def delete(self, key: str, if_version: str | None = None) -> None:
        self._check("delete", key)
        self.store.delete(key, if_version=if_version)

    def list(self, prefix: str = "") -> Iterator[str]:
        return (entry.key for entry in self._paged("list", prefix, self._keys(prefix)))

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        """The store's own :func:`~mapper_state.stores.base.listing` (skipping ``exclude``
        where it can), each page asked for only while the deadline has not passed."""
        return self._paged("list", prefix, listing(self.store, prefix, exclude=exclude))

    def _keys(self, prefix: str) -> Iterator[Entry]:
        for key in self.store.list(prefix):
            yield Entry(key)

    def _paged(self, op: str, prefix: str, entries: Iterator[Entry]) -> Iterator[Entry]:
        """``entries``, checking the deadline before each step: a step may ask for a page."""
        while True:
            self._check(op, prefix)
            try:
                entry = next(entries)
            except StopIteration:
                return
            yield entry

    def close(self) -> None:
        self.store.close()

    def __getattr__(self, name: str) -> Any:
        """What the store has besides the interface (a file store's ``root``)."""
        if name == "store":  # not set yet (a copy being made): no store to ask
            raise AttributeError(name)
        return getattr(self.store, name)


def guarded(store: BlobStore) -> BlobStore:
    """``store`` inside a :class:`Guarded` (once: a guarded store is returned as it is)."""
    return store if isinstance(store, Guarded) else Guarded(store)
