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
true deadline, ``retry_deadline_seconds`` (the registry opens the store with a third of
the lease TTL). Connection failures and server restarts are retried within the deadline;
refused credentials and missing privileges are not.

The package's modules: :mod:`.connection` (the connection, its deadline and watchdog),
:mod:`.errors` (what a failure means, which privilege is lacking), :mod:`.schema` (the
table's name and creation) and this one (the calls of the store interface).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from mapper_state.errors import ConfigError
from mapper_state.redact import redact, uri_secrets
from mapper_state.stores.base import (
    Blob,
    Entry,
    Opener,
    PreconditionFailed,
    StoreError,
    StoreTraits,
    check_key,
    landed_version,
)
from mapper_state.stores.postgres.connection import ConnectFailed, Connection, Link, NoAnswer
from mapper_state.stores.postgres.errors import CannotCreate, Diagnosis
from mapper_state.stores.postgres.schema import (
    DEFAULT_SCHEMA,
    DEFAULT_TABLE,
    ensure_table,
    escape_like,
    identifier,
    split_query,
)
from mapper_state.stores.retry import DEFAULT_DEADLINE_SECONDS, RetryDeadline, RetryStats

T = TypeVar("T")


class PostgresStore(RetryDeadline):
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
        self.link = Link(self.params, lambda: self.retry_deadline_seconds)
        self._diagnosis = Diagnosis(
            self.link,
            schema,
            self.table_name,
            #: the table's name as the server's functions take it (to_regclass...)
            self._qualified.as_string(None),
            [p for p in (self.params.get("password"),) if p],
            lambda: self.retry_deadline_seconds,
        )

    # -- naming --------------------------------------------------------------------------
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

    def _run(self, op: str, key: str, statement: Callable[[Connection], T]) -> tuple[T, RetryStats]:
        """Run ``statement`` with retries, within the deadline; a failure as a store error."""
        stats = RetryStats()
        try:
            result = self.link.run(f"{op} {self._where(key)}", statement, stats)
        except StoreError:
            raise
        except (psycopg.Error, ConnectFailed, NoAnswer, CannotCreate) as exc:
            raise self._diagnosis.store_error(exc, op, self._where(key), stats) from None
        return result, stats

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
                ensure_table(conn, self.schema, self.table, self.params.get("dbname"))
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
        pattern = escape_like(prefix) + "%"
        excluded = (escape_like(skip) + "%",) if skip else ()
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
        """Close the connection (a later call opens a new one)."""
        self.link.close()


def _as_version(version: str) -> int | None:
    """A version token as the column's integer; ``None`` for one this store never made."""
    try:
        return int(version)
    except (TypeError, ValueError):
        return None


def from_uri(location: str, options: Mapping[str, Any], **kwargs: Any) -> PostgresStore:
    """``user@host:port/dbname?schema=&table=&<libpq parameters>`` with ``state_backend.postgres.*``."""
    uri = f"postgresql://{location}"
    secrets = [*uri_secrets(uri), *([str(options["password"])] if options.get("password") else [])]
    libpq_uri, ours = split_query(uri)
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(libpq_uri).items() if v is not None}
    except psycopg.ProgrammingError as exc:
        reason = redact(" ".join(str(exc).split()), secrets)
        raise ConfigError(
            f"setting state_backend.uri is not a usable PostgreSQL URI: {reason}"
        ) from None
    shown = redact(f"postgresql://{location}", secrets)
    schema = identifier(ours.get("schema", DEFAULT_SCHEMA), "schema", shown)
    table = identifier(ours.get("table", DEFAULT_TABLE), "table", shown)
    if not params.get("password") and options.get("password"):
        params["password"] = str(options["password"])
    return PostgresStore(params, schema=schema, table=table, **kwargs)


# What the type checker proves: the opener has the registry's signature, so the store it
# returns serves the whole interface.
_OPENER: Opener = from_uri
