"""The one interface every store implements, and the errors it may raise.

Everything clever (leases, fencing, Meltano's document layout, history) lives
above this interface and is written once; a store only moves opaque bytes with
the store's native conditional operations.

Checklist for writing a new store (see ``file.py`` for a small one, ``s3/`` for a cloud one):

1. Declare it: a :class:`StoreType` named ``STORE`` with its URI schemes, its settings
   (short names; they become ``state_backend.<section>.<name>``, with their environment
   variables, ``--about`` entries and Meltano variables, secrets redacted everywhere)
   and its opener ``"module:function"``. A store with a heavy SDK is a package whose
   ``__init__`` holds only the declaration, so listing settings never imports the SDK.
   Built-in stores are listed in :data:`mapper_state.stores.BUILTIN`; others register
   the declaration in the ``mapper_state.stores`` entry-point group.
2. ``read`` returns ``None`` when the object is absent: "no state" is not an error.
3. ``create`` must be atomic create-if-absent (S3 ``If-None-Match: *``, GCS
   ``if_generation_match=0``, Azure ``If-None-Match: *``, ``O_EXCL`` locally) and raise
   :class:`PreconditionFailed` when the object exists.
4. ``replace`` must be an atomic compare-and-swap on the version returned by ``read``,
   ``create`` or a previous ``replace`` (ETag, generation...), raising
   :class:`PreconditionFailed` on a mismatch or when the object is gone. A version
   never repeats for a key, not even after a delete (no counter restarting at 1): a
   stale version must never match a newer object.
5. ``delete`` with ``if_version`` is conditional in the same way; without it, it
   is unconditional and deleting an absent object is not an error.
6. ``list`` yields every key under a key prefix, following pagination. Optionally,
   ``list_entries(prefix, exclude)`` also reports each object's modification time and
   skips the keys under ``exclude`` without listing them where the service can start a
   listing after a given key (see :func:`listing`, which serves every store alike).
7. Map the SDK's typed errors (or HTTP status codes), never message text:
   404 -> absent, 412/409 -> :class:`PreconditionFailed`, auth -> :class:`StoreAccessDenied`,
   anything else -> :class:`StoreError`. Retry transient failures (5xx, throttling,
   connection resets) in one layer only, :func:`mapper_state.stores.retry.retrying`
   (the SDK's own retries off), within ``traits.retry_deadline_seconds``, which the
   opener takes as ``retry_deadline_seconds=`` (declare ``retries=True``: the registry
   opens the store with a third of the lease TTL). A cloud store gets all of this,
   and paging, from :class:`mapper_state.stores.cloud.CloudStore`. A call honours the
   deadline its caller carries (:mod:`mapper_state.stores.deadline`): its SDK timeouts fit
   ``seconds_left(...)``. That nothing is sent once it has passed is kept above the stores
   (:mod:`mapper_state.stores.guard`); only a call that sends several requests (retries, a
   read-back) checks ``deadline.check`` before each, as ``CloudStore`` does.
8. Set ``traits`` (:class:`StoreTraits`, frozen) in ``__init__``: ``enforces_delete_conditions``
   only where the service is known to refuse a stale conditional delete; what the store
   learns from its answers later goes into ``traits.learned`` (set-once facts). ``close()``
   releases connections. Declare the opener's type (``_OPENER: Opener = from_uri``, or
   pass the function itself as ``opener``) so that mypy proves the store fits.
9. Keys are ``/``-separated, relative to the store's root (the URI's prefix). The
   store joins its prefix exactly once, whatever slashes the user typed.
10. Import the SDK inside the store's implementation only (the import-linter contract
   in ``pyproject.toml`` checks it).
11. Run :mod:`mapper_state.testing` (``StoreContract``, ``LeaseContract``) against it
   with fixtures that open it on a real server (see ``docs/stores.md``).
12. A store object is called from several threads at once (the lease's heartbeat
   renews while the run reads and writes): make it thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mapper_state.errors import ExitCode, MapperStateError
from mapper_state.settings import SettingSpec


class StoreError(MapperStateError):
    """The store failed or could not be reached.

    ``definite``: the store answered, and nothing was applied (a bucket or container that
    does not exist): a write that failed so needs no reading back to learn its outcome.
    """

    exit_code = ExitCode.STORE

    def __init__(
        self,
        message: str,
        *,
        exit_code: int | None = None,
        detail: str = "",
        definite: bool = False,
    ) -> None:
        super().__init__(message, exit_code=exit_code, detail=detail)
        self.definite = definite


def missing_bucket(what: str, name: str, where: str) -> StoreError:
    """The one line for a bucket or container that does not exist (``what`` says which:
    ``S3 bucket``), at ``where`` (the endpoint): a setting to fix, exit 2, and definite."""
    return StoreError(
        f"{what} {name!r} does not exist at {where}: create it or fix state_backend.uri",
        exit_code=ExitCode.CONFIG,
        definite=True,
    )


class StoreAccessDenied(StoreError):
    """The store refused our credentials or the operation."""


class PreconditionFailed(StoreError):
    """A conditional write was rejected: the object exists, or its version moved on."""


class ConditionNotSupported(StoreError):
    """The store does not take a delete with a version condition (S3 endpoints that answer
    501 NotImplemented): nothing was deleted; a plain delete works."""


@dataclass(frozen=True)
class Blob:
    """An object's bytes together with the version token a compare-and-swap needs."""

    data: bytes
    version: str


class Fact:
    """One thing a store may learn about its service while it runs, at most once.

    Safe across threads: the heartbeat reads it while the run's own call may be learning
    it. Once known it stays known; nothing unlearns it. A call that depends on it decides
    from what it sent, not from what the fact says after the answer came back.
    """

    def __init__(self) -> None:
        self._known = threading.Event()

    @property
    def known(self) -> bool:
        return self._known.is_set()

    def learn(self) -> None:
        self._known.set()


@dataclass(frozen=True)
class Learned:
    """What a store learns about its service from its answers (each a :class:`Fact`)."""

    #: The endpoint matches ``If-Match`` only without the quotes S3 puts around ETags.
    unquoted_etags: Fact = field(default_factory=Fact)
    #: The store answers a delete with a version condition "not implemented"
    #: (:class:`ConditionNotSupported`): commands holding the lease delete without it.
    refuses_delete_conditions: Fact = field(default_factory=Fact)


@dataclass(frozen=True)
class StoreTraits:
    """What a store enforces and how long it retries: typed fields, read by the lease and
    ``doctor``, so a misspelt trait is a type error instead of a silently skipped safety path.

    Fixed when the store is opened (frozen): ``retry_deadline_seconds`` is the opener's
    parameter, the rest the store's own. What it learns later (an S3 endpoint's unquoted
    ETags on its first refused replace) goes into ``learned``, once, safely across threads.
    """

    #: A delete whose version condition does not match is refused, so release may delete.
    enforces_delete_conditions: bool = False
    #: Seconds within which every call gives up, retries included; ``None``: no retry layer.
    retry_deadline_seconds: float | None = None
    #: The store is not known to refuse a second create-if-absent (an S3-compatible
    #: endpoint): every acquire of a lease proves it does, at the cost of one request.
    proves_create_condition: bool = False
    #: What the store has learned from its answers since it was opened.
    learned: Learned = field(default_factory=Learned, compare=False)


@runtime_checkable
class BlobStore(Protocol):
    """Opaque objects addressed by key, with conditional create, replace and delete."""

    @property
    def traits(self) -> StoreTraits:
        """What this store enforces (see :class:`StoreTraits`), fixed when it is opened."""
        ...

    @property
    def display_uri(self) -> str:
        """The store's URI with any secret removed, for messages and logs."""
        ...

    def read(self, key: str) -> Blob | None:
        """The object and its version, or ``None`` when it does not exist."""
        ...

    def create(self, key: str, data: bytes) -> str:
        """Write a new object only if none exists; return its version."""
        ...

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        """Overwrite the object only if its version is ``if_version``; return the new one."""
        ...

    def delete(self, key: str, if_version: str | None = None) -> None:
        """Remove the object (only at ``if_version`` when given)."""
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key that starts with ``prefix``, in no particular order."""
        ...

    def close(self) -> None:
        """Release connections and clients; the store is not used afterwards."""
        ...


@dataclass(frozen=True)
class Entry:
    """A listed key, and when its object was last written (epoch seconds) if the store says."""

    key: str
    modified: float | None = None


@runtime_checkable
class ListsEntries(Protocol):
    """An optional capability: a listing with modification times that can skip a range."""

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        """Every key that starts with ``prefix`` but not with ``exclude``, in no particular order."""
        ...


def listing(store: BlobStore, prefix: str = "", *, exclude: str | None = None) -> Iterator[Entry]:
    """Every key under ``prefix`` except those under ``exclude``, with times where known.

    A store that implements :class:`ListsEntries` skips the excluded keys without paging
    through them where its service allows; any other store's keys are filtered here.
    """
    if exclude and prefix.startswith(exclude):
        return
    if isinstance(store, ListsEntries):
        yield from store.list_entries(prefix, exclude)
        return
    for key in store.list(prefix):
        if not (exclude and key.startswith(exclude)):
            yield Entry(key)


def check_key(key: str) -> str:
    """``key`` if it is a safe relative key (no empty, ``.`` or ``..`` segment, no NUL)."""
    if not key or "\x00" in key or any(p in ("", ".", "..") for p in key.split("/")):
        raise StoreError(f"invalid key {key!r}")
    return key


def landed_version(store: BlobStore, key: str, data: bytes, retried: bool) -> str | None:
    """After a retried conditional write was refused: did an earlier attempt land?

    A retry whose first attempt succeeded but lost its response sees its own write
    as a conflict. If the object now holds exactly our bytes, that write was ours:
    return its version. ``None`` means the refusal stands.
    """
    if not retried:
        return None
    current = store.read(key)
    return current.version if current is not None and current.data == data else None


def join_key(*parts: str) -> str:
    """Join key parts with exactly one ``/`` between them and none at either end."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


#: ``open(location, options)``: the URI without its ``scheme://`` and the store's settings.
Opener = Callable[[str, Mapping[str, Any]], BlobStore]


@dataclass(frozen=True)
class StoreType:
    """What a store module declares: its URI schemes, its settings and how to open it.

    ``settings`` use short names (``region``); they become ``state_backend.<section>.<name>``
    settings, with ``MAPPER_STATE_STATE_BACKEND__<SECTION>__<NAME>`` variables, entries in
    ``--about`` and ``meltano.yml``, and Meltano's ``MELTANO_STATE_BACKEND_<SECTION>_<NAME>``.
    ``opener`` is ``"module:function"``, imported only when one of the schemes is used,
    so a store's SDK costs nothing to a run on another store.
    """

    section: str
    schemes: tuple[str, ...]
    opener: str | Opener
    description: str = ""
    settings: tuple[SettingSpec, ...] = ()
    #: The extra to install for the store's library: ``pip install 'mapper-state[<extra>]'``.
    extra: str | None = None
    #: Meltano's names for some settings, where they differ from ours: ``{meltano: ours}``.
    meltano_aliases: Mapping[str, str] = field(default_factory=dict)
    #: Environment variables the store's SDK reads secrets from, hidden like secret settings.
    secret_env_vars: tuple[str, ...] = ()
    #: The store retries within a deadline per call, and its opener takes it as
    #: ``retry_deadline_seconds=``: the registry opens it with a third of the lease TTL.
    retries: bool = False
