"""One connection per store, in autocommit, behind a lock, with a true deadline on every call.

Connecting is bounded by ``connect_timeout``, a statement by the server's
``statement_timeout`` and, should the server or the network stop answering altogether,
by a :class:`Watchdog` that shuts the socket down. The connection is reopened after
any failure; connection failures and restarts are retried within the deadline by
:func:`~mapper_state.stores.retry.retrying`, refused credentials are not.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo

from mapper_state.stores import deadline
from mapper_state.stores.retry import RetryPolicy, RetryStats, retrying

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

_GRACE_SECONDS = 0.25  # the watchdog fires this long after the server's statement_timeout
MIN_CONNECT_SECONDS = 2  # libpq's (and psycopg's) smallest connect_timeout
_MIN_ATTEMPT_SECONDS = 0.05


class ConnectFailed(Exception):
    """psycopg could not open a connection; ``refused`` when the credentials were the reason."""

    def __init__(self, cause: psycopg.OperationalError, refused: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.refused = refused


class NoAnswer(Exception):
    """The server did not answer within the call's deadline (the watchdog cut the socket)."""


def credentials_refused(exc: psycopg.OperationalError) -> bool:
    """Did a connection fail on its credentials (libpq's structured flags, not the message)?

    ``needs_password``: the server asked for a password and none was given.
    ``used_password``: one was sent and the server then refused the connection, for the
    password or a reason that follows it (no such database, no CONNECT, no LOGIN): none
    of these goes away by retrying. A refusal before authentication (pg_hba.conf, peer)
    has neither flag and is retried until the deadline, then reported with its reason.
    """
    pgconn = exc.pgconn
    return pgconn is not None and bool(pgconn.needs_password or pgconn.used_password)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ConnectFailed):
        return not exc.refused
    if isinstance(exc, NoAnswer):
        return True
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecification):
        return False
    # lost connections, restarts (AdminShutdown, CannotConnectNow), timeouts, lock and
    # resource troubles are OperationalErrors; a standby promoted or demoted under us
    # answers ReadOnlySqlTransaction for a moment
    return isinstance(exc, (psycopg.OperationalError, pg_errors.ReadOnlySqlTransaction))


class Watchdog:
    """Shut a connection's socket down if a statement is still running at the deadline.

    The server's ``statement_timeout`` ends a statement that runs too long, but not one
    the server never receives or never answers (a frozen host, a network partition):
    then the client would wait on the socket for ever. Shutting the socket down wakes
    psycopg with a lost connection, which the store reopens on the next attempt.
    """

    def __init__(self, conn: Connection, seconds: float) -> None:
        self.fd = conn.fileno()
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            try:
                sock = socket.socket(fileno=os.dup(self.fd))
            except OSError:
                return
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


class Link:
    """The store's connection: opened when first needed, shared by its threads under a lock."""

    def __init__(self, params: Mapping[str, str], deadline_seconds: Callable[[], float]) -> None:
        self.params = params  # libpq connection parameters (the password among them)
        self._deadline_seconds = deadline_seconds
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    @property
    def connection(self) -> Connection | None:
        """The open connection, if there is one."""
        return self._conn

    def _connect(self, seconds: float) -> Connection:
        params = dict(self.params)
        wanted = max(MIN_CONNECT_SECONDS, math.ceil(seconds))
        given = params.get("connect_timeout", "")
        if not given.isdigit() or int(given) <= 0 or int(given) > wanted:
            params["connect_timeout"] = str(wanted)
        params.setdefault("fallback_application_name", "mapper-state")
        try:
            conn = psycopg.connect(
                make_conninfo("", **params), autocommit=True, prepare_threshold=None
            )
        except psycopg.OperationalError as exc:
            raise ConnectFailed(exc, credentials_refused(exc)) from None
        try:
            timeout_ms = max(1, int(self._deadline_seconds() * 1000))
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(timeout_ms),))
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _open(self, seconds: float) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(seconds)
        return self._conn

    def _attempt(self, statement: Callable[[Connection], T], seconds: float) -> T:
        """One try of ``statement`` within ``seconds``, the connection reopened if needed."""
        if not self._lock.acquire(timeout=seconds):
            raise NoAnswer(f"another call on this store did not finish within {seconds:.1f} s")
        try:
            conn = self._open(seconds)
            watchdog = Watchdog(conn, seconds + _GRACE_SECONDS)
            try:
                with watchdog:
                    return statement(conn)
            except psycopg.Error as exc:
                if watchdog.fired:
                    self._drop()
                    raise NoAnswer(f"no answer within {seconds:.1f} s") from None
                if conn.broken or isinstance(exc, psycopg.OperationalError):
                    self._drop()
                raise
        finally:
            self._lock.release()

    def run(self, what: str, statement: Callable[[Connection], T], stats: RetryStats) -> T:
        """Run ``statement`` with retries, all within the store's deadline, or the caller's
        (:mod:`~mapper_state.stores.deadline`) when that is sooner: the watchdog of each
        attempt shuts the socket once it has passed."""
        deadline.check(what)
        budget = deadline.seconds_left(self._deadline_seconds())
        ends = time.monotonic() + budget

        def attempt() -> T:
            return self._attempt(statement, max(_MIN_ATTEMPT_SECONDS, ends - time.monotonic()))

        return retrying(
            attempt,
            is_transient=is_transient,
            what=what,
            stats=stats,
            policy=RetryPolicy(deadline_seconds=budget),
        )

    def run_once(self, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One statement without retries, for error messages only."""
        if not self._lock.acquire(timeout=MIN_CONNECT_SECONDS):
            raise NoAnswer("the store is busy")
        try:
            conn = self._open(MIN_CONNECT_SECONDS)
            watchdog = Watchdog(conn, MIN_CONNECT_SECONDS)
            try:
                with watchdog:
                    return conn.execute(query, args).fetchall()
            except psycopg.Error:
                if watchdog.fired or conn.broken:
                    self._drop()
                raise
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close the connection (a later call opens a new one). No watchdog outlives it:
        each is cancelled when its statement ends, and the lock waits for that."""
        with self._lock:
            self._drop()
