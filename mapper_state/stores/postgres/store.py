"""PostgreSQL through psycopg 3: objects as rows of one table, each call one autocommit statement.

``postgresql://user@host:port/dbname?schema=public&table=mapper_state_objects``
(``postgres://`` too). Every other query parameter (``sslmode``, ``options``...) is
libpq's and passes through; so do libpq's own sources of settings (``PGPASSWORD``,
``~/.pgpass``, ``PGSERVICE`` and service files, ``PGSSLMODE``...).

The table holds ``key``, ``data``, ``version`` and two timestamps. ``version`` is a
``bigserial``: every write draws a new value from one sequence, so a version never
repeats for a key, not even after a delete and a re-create, and the same bytes
written twice get two versions (no A-B-A as with S3's content-hash ETags). The
conditional calls are single statements, so no transaction is ever left open:

- create: ``INSERT ... ON CONFLICT (key) DO NOTHING RETURNING version``
- replace: ``UPDATE ... SET version = DEFAULT WHERE key = $1 AND version = $2 RETURNING version``
- conditional delete: ``DELETE ... WHERE key = $1 AND version = $2 RETURNING version``

The table (and its schema) is created by the first ``create`` that finds it missing,
in one short transaction serialised by an advisory lock; a role that may not create
it gets one line naming the privilege it lacks.

One connection per store object, in autocommit, behind a lock (the lease heartbeat
and the main thread share a store), reopened after any failure. Every call has a
true deadline, ``retry_deadline_seconds`` (the registry lowers it to a third of the
lease TTL): connecting is bounded by ``connect_timeout``, a statement by the
server's ``statement_timeout`` and, should the server or the network stop answering
altogether, by a watchdog that shuts the socket down. Connection failures and
server restarts are retried within the deadline; refused credentials and missing
privileges are not.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mapper_state.errors import ConfigError
from mapper_state.redact import redact, uri_secrets
from mapper_state.stores.base import (
    Blob,
    BlobStore,
    Entry,
    Opener,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreTraits,
    check_key,
    landed_version,
)
from mapper_state.stores.retry import DEFAULT_DEADLINE_SECONDS, RetryStats, retrying

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

_SETTING = "state_backend.postgres."
_PASSWORD_SETTING = _SETTING + "password"
DEFAULT_SCHEMA = "public"
DEFAULT_TABLE = "mapper_state_objects"
_NAME_BYTES = 63  # PostgreSQL silently truncates longer identifiers
_GRACE_SECONDS = 0.25  # the watchdog fires this long after the server's statement_timeout
_MIN_CONNECT_SECONDS = 2  # libpq's (and psycopg's) smallest connect_timeout
_MIN_ATTEMPT_SECONDS = 0.05
#: Privileges each call needs on the table (RETURNING and WHERE read columns: SELECT).
_NEEDS = {
    "read": ("SELECT",),
    "list": ("SELECT",),
    "create": ("INSERT", "SELECT"),
    "replace": ("UPDATE", "SELECT"),
    "delete": ("DELETE", "SELECT"),
}
#: Calls that draw a new version from the table's sequence (USAGE on it).
_DRAWS_VERSION = ("create", "replace")


class _ConnectFailed(Exception):
    """psycopg could not open a connection; ``refused`` when the credentials were the reason."""

    def __init__(self, cause: psycopg.OperationalError, refused: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.refused = refused


class _NoAnswer(Exception):
    """The server did not answer within the call's deadline (the watchdog cut the socket)."""


class _CannotCreate(Exception):
    """The table (or its schema) is missing and this role may not create it."""

    def __init__(self, what: str, privilege: str) -> None:
        super().__init__(what)
        self.what = what
        self.privilege = privilege


def _credentials_refused(exc: psycopg.OperationalError) -> bool:
    """Did a connection fail on its credentials (libpq's structured flags, not the message)?

    ``needs_password``: the server asked for a password and none was given.
    ``used_password``: one was sent and the server then refused the connection, for the
    password or a reason that follows it (no such database, no CONNECT, no LOGIN): none
    of these goes away by retrying. A refusal before authentication (pg_hba.conf, peer)
    has neither flag and is retried until the deadline, then reported with its reason.
    """
    pgconn = exc.pgconn
    return pgconn is not None and bool(pgconn.needs_password or pgconn.used_password)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, _ConnectFailed):
        return not exc.refused
    if isinstance(exc, _NoAnswer):
        return True
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecification):
        return False
    # lost connections, restarts (AdminShutdown, CannotConnectNow), timeouts, lock and
    # resource troubles are OperationalErrors; a standby promoted or demoted under us
    # answers ReadOnlySqlTransaction for a moment
    return isinstance(exc, (psycopg.OperationalError, pg_errors.ReadOnlySqlTransaction))


def _escape_like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class _Watchdog:
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

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


class PostgresStore:
    """Objects as rows of ``schema.table`` in one database; keys are the rows' keys."""

    def __init__(
        self,
        params: Mapping[str, str],
        *,
        schema: str = DEFAULT_SCHEMA,
        table: str = DEFAULT_TABLE,
        retry_deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        page_size: int = 1000,
    ) -> None:
        self.params = dict(params)  # libpq connection parameters (the password among them)
        self.schema = schema
        self.table = table
        # a delete conditional on the version is one ``DELETE ... WHERE version = %s``
        self.traits = StoreTraits(
            enforces_delete_conditions=True, retry_deadline_seconds=retry_deadline_seconds
        )
        self.page_size = page_size
        self._qualified = sql.Identifier(schema, table)
        #: the table's name as the server's functions take it (to_regclass, has_table_privilege)
        self._regname = self._qualified.as_string(None)
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._secrets = [p for p in (self.params.get("password"),) if p]

    # -- naming --------------------------------------------------------------------------

    @property
    def retry_deadline_seconds(self) -> float:
        """Seconds within which every call gives up, retries included."""
        return self.traits.retry_deadline_seconds or DEFAULT_DEADLINE_SECONDS

    @retry_deadline_seconds.setter
    def retry_deadline_seconds(self, seconds: float) -> None:
        self.traits.retry_deadline_seconds = seconds

    @property
    def display_uri(self) -> str:
        """``postgresql://user@host:port/dbname`` (and a non-default schema or table); no password."""
        user = self.params.get("user")
        host = self.params.get("host", "")
        port = self.params.get("port")
        netloc = (f"{quote(user, safe='')}@" if user else "") + quote(host, safe=",:[]")
        if port:
            netloc += f":{port}"
        uri = f"postgresql://{netloc}/{quote(self.params.get('dbname', ''), safe='')}"
        query = {
            k: v
            for k, v in (("schema", self.schema), ("table", self.table))
            if v != {"schema": DEFAULT_SCHEMA, "table": DEFAULT_TABLE}[k]
        }
        return uri + (f"?{urlencode(query)}" if query else "")

    @property
    def table_name(self) -> str:
        """``schema.table``, for messages."""
        return f"{self.schema}.{self.table}"

    def _where(self, key: str) -> str:
        return f"{key} in {self.display_uri}" if key else self.display_uri

    def _clean(self, text: str) -> str:
        """A libpq or server message on one line, with no password in it."""
        return redact(" ".join(text.split()), self._secrets)

    # -- the connection --------------------------------------------------------------------
    def _connect(self, seconds: float) -> Connection:
        params = dict(self.params)
        wanted = max(_MIN_CONNECT_SECONDS, math.ceil(seconds))
        given = params.get("connect_timeout", "")
        if not given.isdigit() or int(given) <= 0 or int(given) > wanted:
            params["connect_timeout"] = str(wanted)
        params.setdefault("fallback_application_name", "mapper-state")
        try:
            conn = psycopg.connect(
                make_conninfo("", **params), autocommit=True, prepare_threshold=None
            )
        except psycopg.OperationalError as exc:
            raise _ConnectFailed(exc, _credentials_refused(exc)) from None
        try:
            timeout_ms = max(1, int(self.retry_deadline_seconds * 1000))
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(timeout_ms),))
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _run(self, op: str, key: str, statement: Callable[[Connection], T]) -> tuple[T, RetryStats]:
        """Run ``statement`` on the connection with retries, within the deadline."""
        stats = RetryStats()
        deadline = time.monotonic() + self.retry_deadline_seconds

        def attempt() -> T:
            seconds = max(_MIN_ATTEMPT_SECONDS, deadline - time.monotonic())
            if not self._lock.acquire(timeout=seconds):
                raise _NoAnswer(f"another call on this store did not finish within {seconds:.1f} s")
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect(seconds)
                conn = self._conn
                watchdog = _Watchdog(conn, seconds + _GRACE_SECONDS)
                try:
                    with watchdog:
                        return statement(conn)
                except psycopg.Error as exc:
                    if watchdog.fired:
                        self._drop_connection()
                        raise _NoAnswer(f"no answer within {seconds:.1f} s") from None
                    if conn.broken or isinstance(exc, psycopg.OperationalError):
                        self._drop_connection()
                    raise
            finally:
                self._lock.release()

        try:
            result = retrying(
                attempt,
                is_transient=_is_transient,
                what=f"{op} {self._where(key)}",
                stats=stats,
                deadline_seconds=self.retry_deadline_seconds,
            )
        except StoreError:
            raise
        except (psycopg.Error, _ConnectFailed, _NoAnswer, _CannotCreate) as exc:
            raise self._store_error(exc, op, key, stats) from None
        return result, stats

    # -- errors ----------------------------------------------------------------------------
    def _store_error(self, exc: Exception, op: str, key: str, stats: RetryStats) -> StoreError:
        where = self._where(key)
        user = self.params.get("user") or "the current user"
        if isinstance(exc, _ConnectFailed):
            reason = self._clean(str(exc.cause).removeprefix("connection failed:"))
            if exc.refused:
                return StoreAccessDenied(
                    f"PostgreSQL refused the connection as {user} for {op} of {where}: {reason} "
                    f"(set {_PASSWORD_SETTING}, or the password in state_backend.uri, PGPASSWORD "
                    "or ~/.pgpass; check that the role may log in to the database)"
                )
            return StoreError(
                f"cannot reach PostgreSQL for {op} of {where}: {reason}{stats.summary()}"
            )
        if isinstance(exc, _NoAnswer):
            return StoreError(f"PostgreSQL gave no answer to {op} of {where}: {exc}")
        if isinstance(exc, _CannotCreate):
            return StoreAccessDenied(
                f"the PostgreSQL role {self._role()} may not create {exc.what} for {where}: "
                f"it lacks {exc.privilege} (grant it, or have a role that may run "
                "`mapper-state doctor` once and grant this one SELECT, INSERT, UPDATE, DELETE "
                "on the table and USAGE on its sequence)"
            )
        if isinstance(exc, pg_errors.InvalidAuthorizationSpecification):
            return StoreAccessDenied(
                f"PostgreSQL refused {user} for {op} of {where}: {self._clean(str(exc))} "
                f"(check {_PASSWORD_SETTING})"
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return StoreAccessDenied(self._privilege_message(op, where))
        if isinstance(exc, pg_errors.QueryCanceled):
            return StoreError(
                f"PostgreSQL did not finish {op} of {where} within "
                f"{self.retry_deadline_seconds:g} s (statement_timeout){stats.summary()}"
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(
                f"PostgreSQL {op} of {where} failed: {self._clean(str(exc))}{stats.summary()}"
            )
        code = f" ({exc.sqlstate})" if isinstance(exc, psycopg.Error) and exc.sqlstate else ""
        return StoreError(f"PostgreSQL {op} of {where} failed{code}: {self._clean(str(exc))}")

    def _role(self) -> str:
        """The role the server sees us as (best effort: only for messages)."""
        try:
            (row,), _ = self._run_once("SELECT current_user", ())
            return str(row[0])
        except (psycopg.Error, _ConnectFailed, _NoAnswer):
            return self.params.get("user") or "of this connection"

    def _run_once(self, query: str, args: tuple[Any, ...]) -> tuple[list[tuple[Any, ...]], None]:
        """One statement without retries, for error messages only."""
        if not self._lock.acquire(timeout=_MIN_CONNECT_SECONDS):
            raise _NoAnswer("the store is busy")
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect(_MIN_CONNECT_SECONDS)
            conn = self._conn
            watchdog = _Watchdog(conn, _MIN_CONNECT_SECONDS)
            try:
                with watchdog:
                    return conn.execute(query, args).fetchall(), None
            except psycopg.Error:
                if watchdog.fired or conn.broken:
                    self._drop_connection()
                raise
        finally:
            self._lock.release()

    def _privilege_message(self, op: str, where: str) -> str:
        """Which privilege the role lacks for ``op``, asked of the server itself."""
        table, regname = self.table_name, self._regname
        needed = _NEEDS.get(op, ("SELECT",))
        missing: list[str] = []
        role = self.params.get("user") or "this role"
        try:
            checks = ", ".join(
                [
                    "current_user",
                    "has_schema_privilege(%s, 'USAGE')",
                    *(f"has_table_privilege(%s, '{p}')" for p in needed),
                    "has_sequence_privilege(pg_get_serial_sequence(%s, 'version'), 'USAGE')",
                    "pg_get_serial_sequence(%s, 'version')",
                ]
            )
            args = (self.schema, *([regname] * len(needed)), regname, regname)
            (row,), _ = self._run_once(f"SELECT {checks}", args)
            role, schema_ok, *rest = row
            table_ok, (sequence_ok, sequence) = rest[: len(needed)], rest[len(needed) :]
            if not schema_ok:
                missing.append(f"USAGE on schema {self.schema}")
            missing += [f"{p} on {table}" for p, ok in zip(needed, table_ok, strict=True) if not ok]
            if op in _DRAWS_VERSION and not sequence_ok:
                missing.append(f"USAGE on sequence {sequence}")
        except (psycopg.Error, _ConnectFailed, _NoAnswer):
            pass
        lacks = ", ".join(missing) or " and ".join(f"{p} on {table}" for p in needed)
        return f"the PostgreSQL role {role} lacks {lacks} for {op} of {where}"

    # -- the table ------------------------------------------------------------------------
    def _ensure_table(self, conn: Connection) -> None:
        """Create the schema and table if they are missing (one short transaction)."""
        schema = sql.Identifier(self.schema)
        with conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"mapper-state {self.table_name}",)
            )
            row = conn.execute(
                "SELECT to_regnamespace(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                (sql.Identifier(self.schema).as_string(conn), self._regname),
            ).fetchone()
            has_schema, has_table = row if row else (False, False)
            if has_table:
                return
            try:
                if not has_schema:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
            except pg_errors.InsufficientPrivilege:
                db = self.params.get("dbname") or "the database"
                raise _CannotCreate(
                    f"the schema {self.schema}", f"CREATE on database {db}"
                ) from None
            try:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} ("
                        ' key text COLLATE "C" PRIMARY KEY,'
                        " data bytea NOT NULL,"
                        " version bigserial NOT NULL,"
                        " created_at timestamptz NOT NULL DEFAULT now(),"
                        " updated_at timestamptz NOT NULL DEFAULT now())"
                    ).format(self._qualified)
                )
            except pg_errors.InsufficientPrivilege:
                raise _CannotCreate(
                    f"the table {self.table_name}", f"CREATE on schema {self.schema}"
                ) from None
            # Start the versions at the clock in microseconds: a table dropped and created
            # again never hands out a version it handed out before.
            conn.execute(
                "SELECT setval(pg_get_serial_sequence(%s, 'version'),"
                " (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)",
                (self._regname,),
            )

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(table=self._qualified)

    # -- the interface ---------------------------------------------------------------------
    def read(self, key: str) -> Blob | None:
        check_key(key)
        query = self._q("SELECT data, version FROM {table} WHERE key = %s")

        def select(conn: Connection) -> Blob | None:
            try:
                row = conn.execute(query, (key,)).fetchone()
            except pg_errors.UndefinedTable:
                return None  # nothing was ever written here
            return Blob(bytes(row[0]), str(row[1])) if row else None

        return self._run("read", key, select)[0]

    def create(self, key: str, data: bytes) -> str:
        check_key(key)
        query = self._q(
            "INSERT INTO {table} (key, data) VALUES (%s, %s)"
            " ON CONFLICT (key) DO NOTHING RETURNING version"
        )

        def insert(conn: Connection) -> int | None:
            try:
                row = conn.execute(query, (key, data)).fetchone()
            except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
                self._ensure_table(conn)
                row = conn.execute(query, (key, data)).fetchone()
            return int(row[0]) if row else None

        version, stats = self._run("create", key, insert)
        return self._written(key, data, version, stats, "already exists")

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        check_key(key)
        expected = _as_version(if_version)
        query = self._q(
            "UPDATE {table} SET data = %s, version = DEFAULT, updated_at = now()"
            " WHERE key = %s AND version = %s RETURNING version"
        )

        def update(conn: Connection) -> int | None:
            if expected is None:
                return None
            try:
                row = conn.execute(query, (data, key, expected)).fetchone()
            except pg_errors.UndefinedTable:
                return None
            return int(row[0]) if row else None

        version, stats = self._run("replace", key, update)
        return self._written(key, data, version, stats, f"changed since version {if_version}")

    def _written(
        self, key: str, data: bytes, version: int | None, stats: RetryStats, refusal: str
    ) -> str:
        """The version a conditional write produced. When its statement matched nothing, a
        retried attempt may already have landed these bytes: that version, or refused."""
        if version is not None:
            return str(version)
        landed = landed_version(self, key, data, retried=stats.retried)
        if landed is None:
            raise PreconditionFailed(f"{self._where(key)} {refusal}")
        return landed

    def delete(self, key: str, if_version: str | None = None) -> None:
        check_key(key)
        if if_version is None:
            query = self._q("DELETE FROM {table} WHERE key = %s")
            args: tuple[Any, ...] = (key,)
        else:
            expected = _as_version(if_version)
            query = self._q("DELETE FROM {table} WHERE key = %s AND version = %s RETURNING version")
            args = (key, expected if expected is not None else -1)

        def remove(conn: Connection) -> bool:
            try:
                cur = conn.execute(query, args)
            except pg_errors.UndefinedTable:
                return False
            return if_version is None or cur.fetchone() is not None

        deleted, stats = self._run("delete", key, remove)
        if deleted or if_version is None:
            return
        # A retried delete whose first attempt landed finds nothing left to delete.
        if stats.retried and self.read(key) is None:
            return
        raise PreconditionFailed(f"{self._where(key)} changed since version {if_version}")

    def list(self, prefix: str = "") -> Iterator[str]:
        for entry in self.list_entries(prefix):
            yield entry.key

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        """Keys under ``prefix`` but not under ``exclude``, with when each row was written.

        The excluded range is left out by the query itself, so it costs nothing to skip.
        """
        if exclude and prefix.startswith(exclude):
            return
        skip = exclude if exclude and exclude.startswith(prefix) else None
        query = self._q(
            "SELECT key, extract(epoch FROM updated_at) FROM {table}"
            " WHERE key LIKE %s ESCAPE '\\' AND key > %s"
            + (" AND key NOT LIKE %s ESCAPE '\\'" if skip else "")
            + " ORDER BY key LIMIT %s"
        )
        pattern = _escape_like(prefix) + "%"
        excluded = (_escape_like(skip) + "%",) if skip else ()
        after = ""
        while True:

            def page(conn: Connection, after: str = after) -> list[tuple[str, float]]:
                try:
                    rows = conn.execute(
                        query, (pattern, after, *excluded, self.page_size)
                    ).fetchall()
                except pg_errors.UndefinedTable:
                    return []
                return [(str(row[0]), float(row[1])) for row in rows]

            rows, _ = self._run("list", prefix, page)
            for key, modified in rows:
                yield Entry(key, modified)
            if len(rows) < self.page_size:
                return
            after = rows[-1][0]

    def close(self) -> None:
        """Close the connection (a later call opens a new one). No watchdog outlives it:
        each is cancelled when its statement ends, and the lock waits for that."""
        with self._lock:
            self._drop_connection()


def _as_version(version: str) -> int | None:
    """A version token as the column's integer; ``None`` for one this store never made."""
    try:
        return int(version)
    except (TypeError, ValueError):
        return None


def _split_query(uri: str) -> tuple[str, dict[str, str]]:
    """The URI without our own ``schema`` and ``table`` parameters, and their values."""
    base, sep, query = uri.partition("?")
    if not sep:
        return uri, {}
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in ("schema", "table"):
            ours[name] = value
        else:
            theirs.append((name, value))
    return (base + "?" + urlencode(theirs, quote_via=quote) if theirs else base), ours


def _identifier(name: str, what: str, given: str) -> str:
    if not name or "\x00" in name:
        raise ConfigError(f"setting state_backend.uri has an empty {what}: {given}")
    if len(name.encode()) > _NAME_BYTES:
        raise ConfigError(
            f"setting state_backend.uri has a {what} longer than {_NAME_BYTES} bytes: {name[:20]}..."
        )
    return name


def from_uri(location: str, options: Mapping[str, Any], **kwargs: Any) -> PostgresStore:
    """``user@host:port/dbname?schema=&table=&<libpq parameters>`` with ``state_backend.postgres.*``."""
    uri = f"postgresql://{location}"
    secrets = [*uri_secrets(uri), *([str(options["password"])] if options.get("password") else [])]
    libpq_uri, ours = _split_query(uri)
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(libpq_uri).items() if v is not None}
    except psycopg.ProgrammingError as exc:
        reason = redact(" ".join(str(exc).split()), secrets)
        raise ConfigError(
            f"setting state_backend.uri is not a usable PostgreSQL URI: {reason}"
        ) from None
    shown = redact(f"postgresql://{location}", secrets)
    schema = _identifier(ours.get("schema", DEFAULT_SCHEMA), "schema", shown)
    table = _identifier(ours.get("table", DEFAULT_TABLE), "table", shown)
    if not params.get("password") and options.get("password"):
        params["password"] = str(options["password"])
    return PostgresStore(params, schema=schema, table=table, **kwargs)


# What the type checker proves: the class serves the store interface and the opener
# has the registry's signature.
_STORE: type[BlobStore] = PostgresStore
_OPENER: Opener = from_uri
