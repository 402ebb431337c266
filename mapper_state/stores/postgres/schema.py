"""The table: its name (from the URI), and its creation by the first write that misses it.

The table holds ``key``, ``data``, ``version`` and two timestamps; ``version`` is a
``bigserial`` started at the clock in microseconds. It (and its schema) is created in
one short transaction serialised by an advisory lock; a role that may not create it
raises :class:`~mapper_state.stores.postgres.errors.CannotCreate`, naming the privilege.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode

from psycopg import errors as pg_errors
from psycopg import sql

from mapper_state.errors import ConfigError
from mapper_state.stores.postgres.connection import Connection
from mapper_state.stores.postgres.errors import CannotCreate

DEFAULT_SCHEMA = "public"
DEFAULT_TABLE = "mapper_state_objects"
_NAME_BYTES = 63  # PostgreSQL silently truncates longer identifiers


def split_query(uri: str) -> tuple[str, dict[str, str]]:
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


def identifier(name: str, what: str, given: str) -> str:
    """``name`` if PostgreSQL will keep it whole as a schema or table name."""
    if not name or "\x00" in name:
        raise ConfigError(f"setting state_backend.uri has an empty {what}: {given}")
    if len(name.encode()) > _NAME_BYTES:
        raise ConfigError(
            f"setting state_backend.uri has a {what} longer than {_NAME_BYTES} bytes: {name[:20]}..."
        )
    return name


def escape_like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def ensure_table(conn: Connection, schema: str, table: str, dbname: str | None) -> None:
    """Create the schema and table if they are missing (one short transaction)."""
    qualified = sql.Identifier(schema, table)
    regname = qualified.as_string(None)
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"mapper-state {schema}.{table}",)
        )
        row = conn.execute(
            "SELECT to_regnamespace(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (sql.Identifier(schema).as_string(conn), regname),
        ).fetchone()
        has_schema, has_table = row if row else (False, False)
        if has_table:
            return
        try:
            if not has_schema:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        except pg_errors.InsufficientPrivilege:
            db = dbname or "the database"
            raise CannotCreate(f"the schema {schema}", f"CREATE on database {db}") from None
        try:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} ("
                    ' key text COLLATE "C" PRIMARY KEY,'
                    " data bytea NOT NULL,"
                    " version bigserial NOT NULL,"
                    " created_at timestamptz NOT NULL DEFAULT now(),"
                    " updated_at timestamptz NOT NULL DEFAULT now())"
                ).format(qualified)
            )
        except pg_errors.InsufficientPrivilege:
            raise CannotCreate(
                f"the table {schema}.{table}", f"CREATE on schema {schema}"
            ) from None
        # Start the versions at the clock in microseconds: a table dropped and created
        # again never hands out a version it handed out before.
        conn.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'version'),"
            " (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)",
            (regname,),
        )
