"""The skeleton the cloud stores share: one retry layer, error mapping, conditional writes, paging.

S3, Azure and GCS differ only in their SDK calls and in how their errors are
spelled. Everything else is written once here: a request runs through
:func:`~mapper_state.stores.retry.retrying` (the only retry layer: the SDKs'
own retries are off), a permanent failure becomes a :class:`StoreError` through
the store's own mapping, a conditional write refused after a retry checks whether
its first attempt had landed, and listing follows continuation tokens (skipping an
excluded range of keys by starting the listing after it, where the service can).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator
from typing import ClassVar, TypeVar

from mapper_state.errors import ConfigError
from mapper_state.stores import deadline
from mapper_state.stores.base import (
    Blob,
    Entry,
    PreconditionFailed,
    StoreError,
    StoreTraits,
    check_key,
    join_key,
    landed_version,
)
from mapper_state.stores.retry import (
    DEFAULT_DEADLINE_SECONDS,
    RetryDeadline,
    RetryPolicy,
    RetryStats,
    retrying,
)

T = TypeVar("T")
#: One page of a listing: ``(full object name, modified epoch seconds or None)`` pairs in
#: name order, and the token of the next page.
Page = tuple[list[tuple[str, "float | None"]], "str | None"]


def split_location(location: str, scheme: str, container: str = "bucket") -> tuple[str, str]:
    """``("bucket", "prefix")`` from a URI's ``bucket/prefix``; a missing bucket is a config error."""
    bucket, _, prefix = location.strip("/").partition("/")
    if not bucket:
        raise ConfigError(
            f"setting state_backend.uri needs a {container}: {scheme}://{container}/prefix"
        )
    return bucket, prefix


class CloudStore(RetryDeadline, abc.ABC):
    """Objects under ``prefix`` in one bucket or container; keys are relative to the prefix.

    A subclass names its ``scheme``, and implements :meth:`_is_transient`,
    :meth:`_store_error`, :meth:`_list_page` and the four object calls, running each
    request through :meth:`_call` (or :meth:`_conditional_write` for a conditional upload).
    """

    scheme: ClassVar[str]
    #: Whether :meth:`_list_page` honours ``after`` (the service can start a listing at a key).
    can_skip: ClassVar[bool] = True

    #: Per-attempt timeouts when the budget allows: connecting, and waiting for a reply.
    connect_timeout = 5.0
    read_timeout = 30.0

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        retry_deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        page_size: int | None = None,
        enforces_delete_conditions: bool = True,
        proves_create_condition: bool = False,
    ) -> None:
        self.bucket_name = bucket
        self.prefix = join_key(*prefix.split("/"))
        # a subclass passes enforces_delete_conditions=False where the service may ignore them
        self.traits = StoreTraits(
            enforces_delete_conditions=enforces_delete_conditions,
            retry_deadline_seconds=retry_deadline_seconds,
            proves_create_condition=proves_create_condition,
        )
        self.page_size = page_size  # keys per list request; None: the service's default

    @abc.abstractmethod
    def close(self) -> None:
        """Release the SDK's clients and their connections."""

    @property
    def display_uri(self) -> str:
        return f"{self.scheme}://{join_key(self.bucket_name, self.prefix)}"

    def _key(self, key: str) -> str:
        """The object's full name in the bucket."""
        return join_key(self.prefix, check_key(key))

    def _where(self, key: str) -> str:
        return f"{self.display_uri}/{key}" if key else self.display_uri

    # -- what each store supplies -------------------------------------------------
    @abc.abstractmethod
    def _is_transient(self, exc: BaseException) -> bool:
        """Is ``exc`` a failure that may go away by itself (5xx, throttling, a reset)?"""

    @abc.abstractmethod
    def _store_error(
        self, exc: Exception, op: str, where: str, stats: RetryStats
    ) -> StoreError | None:
        """The store error an SDK failure means, or ``None`` to let it propagate."""

    @abc.abstractmethod
    def _list_page(self, prefix: str, token: str | None, after: str | None = None) -> Page:
        """One page of the objects whose full names start with ``prefix``, in name order.

        With ``after``, the listing starts after every name that starts with ``after``.
        """

    @abc.abstractmethod
    def read(self, key: str) -> Blob | None:
        """The object and its version, or ``None`` when it does not exist."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Write a new object only if none exists; return its version."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes, if_version: str) -> str:
        """Overwrite the object only if its version is ``if_version``; return the new one."""

    @abc.abstractmethod
    def delete(self, key: str, if_version: str | None = None) -> None:
        """Remove the object (only at ``if_version`` when given)."""

    # -- written once ---------------------------------------------------------------
    def budget(self) -> float:
        """Seconds left for the store call in progress on this thread: each attempt's
        timeouts are cut to it, so that retries, connect and read timeouts together never
        outlast the call's deadline (see :mod:`~mapper_state.stores.deadline`)."""
        return max(0.05, deadline.seconds_left(self.retry_deadline_seconds))

    def timeouts(self) -> tuple[float, float]:
        """``(connect, read)`` timeouts for the next attempt, cut to the budget left."""
        budget = self.budget()
        connect = min(self.connect_timeout, budget / 2)
        return connect, min(self.read_timeout, budget - connect)

    def _refused(self, key: str, why: str) -> PreconditionFailed:
        """A conditional write or delete of ``key`` the server refused: ``why`` says how."""
        return PreconditionFailed(f"{self.display_uri}/{key} {why}")

    def _call(self, op: str, key: str, fn: Callable[[], T], stats: RetryStats | None = None) -> T:
        """Run one request with retries within its deadline (the store's own limit, or the
        caller's when sooner); turn a permanent failure into a store error."""
        stats = stats or RetryStats()
        where = self._where(key)
        deadline.check(f"{op} {where}")
        try:
            with deadline.within(self.retry_deadline_seconds):
                return retrying(
                    fn,
                    is_transient=self._is_transient,
                    what=f"{op} {where}",
                    stats=stats,
                    policy=RetryPolicy(deadline_seconds=self.budget()),
                )
        except StoreError:
            raise
        except Exception as exc:
            error = self._store_error(exc, op, where, stats)
            if error is None:
                raise
            raise error from None

    def _conditional_write(self, op: str, key: str, data: bytes, write: Callable[[], str]) -> str:
        """Run a conditional upload; a refusal after a retry may be our own first attempt."""
        stats = RetryStats()
        try:
            return self._call(op, key, write, stats)
        except PreconditionFailed:
            version = landed_version(self, key, data, retried=stats.retried)
            if version is None:
                raise
            return version

    def list(self, prefix: str = "") -> Iterator[str]:
        for entry in self.list_entries(prefix):
            yield entry.key

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        """The keys under ``prefix`` but not under ``exclude``, with their modification times.

        Listings come in name order, so once a page ends inside the excluded range the
        next request starts after it, instead of paging through it.
        """
        root = self.prefix + "/" if self.prefix else ""
        if exclude and prefix.startswith(exclude):
            return
        skip = exclude if exclude and exclude.startswith(prefix) else None
        token: str | None = None
        after: str | None = None
        while True:
            page, token = self._call(
                "list", prefix, functools.partial(self._list_page, root + prefix, token, after)
            )
            for name, modified in page:
                key = name[len(root) :]
                if skip is None or not key.startswith(skip):
                    yield Entry(key, modified)
            if not token:
                return
            last = page[-1][0][len(root) :] if page else ""
            if skip is not None and self.can_skip and after is None and last.startswith(skip):
                token, after = None, root + skip  # jump past the excluded range
