"""What a PostgreSQL failure means to the user: one line, no password, the privilege lacking.

Errors are told apart by psycopg's typed exceptions (SQLSTATE classes) and libpq's
flags, never by message text. A refused privilege is diagnosed by asking the server
which of the privileges the call needs the role lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import errors as pg_errors

from mapper_state.redact import redact
from mapper_state.stores.base import StoreAccessDenied, StoreError
from mapper_state.stores.postgres.connection import ConnectFailed, Link, NoAnswer
from mapper_state.stores.retry import RetryStats

SETTING = "state_backend.postgres."
_PASSWORD_SETTING = SETTING + "password"
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
#: What a diagnosis may itself run into; it then says less, never fails.
_UNANSWERED = (psycopg.Error, ConnectFailed, NoAnswer)


class CannotCreate(Exception):
    """The table (or its schema) is missing and this role may not create it."""

    def __init__(self, what: str, privilege: str) -> None:
        super().__init__(what)
        self.what = what
        self.privilege = privilege


@dataclass(frozen=True)
class Diagnosis:
    """Turns the failures of one store's calls into store errors."""

    link: Link
    schema: str
    table_name: str  # ``schema.table``
    regname: str  # the table's name as the server's functions take it
    secrets: Sequence[str]
    deadline_seconds: Callable[[], float]

    @property
    def user(self) -> str | None:
        return self.link.params.get("user")

    def clean(self, text: str) -> str:
        """A libpq or server message on one line, with no password in it."""
        return redact(" ".join(text.split()), list(self.secrets))

    def store_error(self, exc: Exception, op: str, where: str, stats: RetryStats) -> StoreError:
        """The store error ``exc`` means for ``op`` of ``where``."""
        if isinstance(exc, ConnectFailed):
            return self._connect_error(exc, op, where, stats)
        if isinstance(exc, NoAnswer):
            return StoreError(f"PostgreSQL gave no answer to {op} of {where}: {exc}")
        if isinstance(exc, CannotCreate):
            return StoreAccessDenied(
                f"the PostgreSQL role {self._role()} may not create {exc.what} for {where}: "
                f"it lacks {exc.privilege} (grant it, or have a role that may run "
                "`mapper-state doctor` once and grant this one SELECT, INSERT, UPDATE, DELETE "
                "on the table and USAGE on its sequence)"
            )
        if isinstance(exc, pg_errors.InvalidAuthorizationSpecification):
            return StoreAccessDenied(
                f"PostgreSQL refused {self.user or 'the current user'} for {op} of {where}: "
                f"{self.clean(str(exc))} (check {_PASSWORD_SETTING})"
            )
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return StoreAccessDenied(self.privilege_message(op, where))
        if isinstance(exc, pg_errors.QueryCanceled):
            return StoreError(
                f"PostgreSQL did not finish {op} of {where} within "
                f"{self.deadline_seconds():g} s (statement_timeout){stats.summary()}"
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(
                f"PostgreSQL {op} of {where} failed: {self.clean(str(exc))}{stats.summary()}"
            )
        code = f" ({exc.sqlstate})" if isinstance(exc, psycopg.Error) and exc.sqlstate else ""
        return StoreError(f"PostgreSQL {op} of {where} failed{code}: {self.clean(str(exc))}")

    def _connect_error(
        self, exc: ConnectFailed, op: str, where: str, stats: RetryStats
    ) -> StoreError:
        reason = self.clean(str(exc.cause).removeprefix("connection failed:"))
        if exc.refused:
            return StoreAccessDenied(
                f"PostgreSQL refused the connection as {self.user or 'the current user'} for "
                f"{op} of {where}: {reason} (set {_PASSWORD_SETTING}, or the password in "
                "state_backend.uri, PGPASSWORD or ~/.pgpass; check that the role may log in "
                "to the database)"
            )
        return StoreError(f"cannot reach PostgreSQL for {op} of {where}: {reason}{stats.summary()}")

    def _role(self) -> str:
        """The role the server sees us as (best effort: only for messages)."""
        try:
            (row,) = self.link.run_once("SELECT current_user", ())
            return str(row[0])
        except _UNANSWERED:
            return self.user or "of this connection"

    def privilege_message(self, op: str, where: str) -> str:
        """Which privilege the role lacks for ``op``, asked of the server itself."""
        table, regname = self.table_name, self.regname
        needed = _NEEDS.get(op, ("SELECT",))
        missing: list[str] = []
        role = self.user or "this role"
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
            (row,) = self.link.run_once(f"SELECT {checks}", args)
            role, schema_ok, *rest = row
            table_ok, (sequence_ok, sequence) = rest[: len(needed)], rest[len(needed) :]
            if not schema_ok:
                missing.append(f"USAGE on schema {self.schema}")
            missing += [f"{p} on {table}" for p, ok in zip(needed, table_ok, strict=True) if not ok]
            if op in _DRAWS_VERSION and not sequence_ok:
                missing.append(f"USAGE on sequence {sequence}")
        except _UNANSWERED:
            pass
        lacks = ", ".join(missing) or " and ".join(f"{p} on {table}" for p in needed)
        return f"the PostgreSQL role {role} lacks {lacks} for {op} of {where}"
