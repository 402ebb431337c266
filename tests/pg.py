"""A throw-away PostgreSQL cluster: the source of the end-to-end tests, and a store.

A pytest plugin (``tests/conftest.py`` registers it), so any test can ask for it::

    def test_something(postgres):
        postgres.execute("CREATE TABLE t (id int PRIMARY KEY, updated_at timestamptz)")
        config = postgres.tap_config()

    def test_a_store(pg_location):
        store = pg_location.open()  # a postgresql:// store on a fresh table

The session-scoped ``postgres`` fixture runs ``initdb`` in a fresh temporary directory,
starts the server with ``pg_ctl`` on a free port of 127.0.0.1 (and a unix socket in the
same directory), creates a database and stops the server with ``pg_ctl stop -m
immediate`` at the end of the session. ``initdb`` refuses to run as root: as root the
cluster is owned and run by the ``postgres`` system user, or by a system user created
for the purpose when that one does not exist. Missing binaries fail the tests (they are
never skipped): set ``PG_BINDIR`` to the directory holding ``initdb`` and ``pg_ctl`` if
they are somewhere unusual. ``pg_location`` gives each test a fresh table on it, as
a :class:`PostgresLocation` (the ``StoreLocation`` of ``tests/servers.py``, for this
store). ``running_postgres()`` starts a cluster of a test's own, for tests that stop,
restart or freeze the server.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.processes import free_port, killed_if_we_die

if TYPE_CHECKING:
    import psycopg

PG_MAJOR_PREFERRED = "15"
SERVICE_USER_FALLBACK = "mapper-state-pg"


class PostgresSetupError(RuntimeError):
    """The throw-away cluster could not be set up."""


@dataclass
class PostgresServer:
    """A running throw-away cluster, and helpers to talk to it."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    dbname: str
    socket_dir: Path
    data_dir: Path
    bin_dir: Path
    log_file: Path
    os_user: str | None = field(default=None, repr=False)

    # -- connection details ------------------------------------------------------------

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.dbname}"

    def conninfo(self, dbname: str | None = None) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": dbname or self.dbname,
        }

    def tap_config(self, **overrides: Any) -> dict[str, Any]:
        """A config for ``meltanolabs-tap-postgres`` reading this database's public schema."""
        config: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.dbname,
            "filter_schemas": ["public"],
        }
        config.update(overrides)
        return config

    # -- SQL helpers -------------------------------------------------------------------

    def connect(self, dbname: str | None = None) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        return psycopg.connect(**self.conninfo(dbname), autocommit=True, connect_timeout=10)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        """Run one statement (or several, without params) in autocommit mode."""
        with self.connect() as conn:
            conn.execute(sql, params)

    def query(
        self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run a query and return all its rows."""
        with self.connect() as conn:
            return list(conn.execute(sql, params).fetchall())

    def psql(
        self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run SQL; return the rows of the last statement if it returned any, else []."""
        with self.connect() as conn:
            cur = conn.execute(sql, params)
            while cur.nextset():
                pass
            return cur.fetchall() if cur.description is not None else []

    def create_role(self, name: str, password: str, *grants: str) -> None:
        """A login role with ``password``, and the given GRANT statements run for it."""
        from psycopg import sql as pgsql

        with self.connect() as conn:
            conn.execute(
                pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    pgsql.Identifier(name), pgsql.Literal(password)
                )
            )
            for grant in grants:
                conn.execute(grant.format(role=pgsql.Identifier(name).as_string(conn)))

    def uri(self, table: str | None = None, user: str | None = None, **query: str) -> str:
        """``postgresql://user@127.0.0.1:port/db?table=...``, without a password."""
        params = {**({"table": table} if table else {}), **query}
        tail = ("?" + "&".join(f"{k}={v}" for k, v in params.items())) if params else ""
        return f"postgresql://{user or self.user}@{self.host}:{self.port}/{self.dbname}{tail}"

    def pg_ctl(self, *args: str, timeout: float = 90) -> str:
        """Run ``pg_ctl ARGS -D <data dir>`` as the cluster's owner."""
        return _run(
            [str(self.bin_dir / "pg_ctl"), *args, "-D", str(self.data_dir)],
            self.os_user,
            self.data_dir.parent,
            timeout=timeout,
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is terminated; same port and options."""
        self.pg_ctl("restart", "-m", "fast", "-w", "-t", "60", "-l", str(self.log_file))

    def processes(self) -> list[int]:
        """The postmaster and every process it started (to freeze the whole server)."""
        postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        found = [postmaster]
        for entry in os.listdir("/proc"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    found.append(int(entry))
        return found

    def backend_pids(self, application_name: str) -> list[int]:
        """The server processes serving connections of ``application_name``."""
        rows = self.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        )
        return [int(pid) for (pid,) in rows]

    def create_database(self, name: str) -> None:
        from psycopg import sql as pgsql

        with self.connect("postgres") as conn:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))


# -- locating binaries -----------------------------------------------------------------


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl`` (PostgreSQL 15 preferred)."""
    candidates: list[Path] = []
    env = os.environ.get("PG_BINDIR")
    if env:
        candidates.append(Path(env))
    versioned = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: (Path(p).parent.name != PG_MAJOR_PREFERRED, -_major(Path(p).parent.name)),
    )
    candidates.extend(Path(p) for p in versioned)
    candidates.extend(Path(p) for p in sorted(glob.glob("/usr/pgsql-*/bin")))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for cand in candidates:
        if (cand / "initdb").is_file() and (cand / "pg_ctl").is_file():
            return cand
    raise PostgresSetupError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: looked in "
        + (", ".join(str(c) for c in candidates) or "/usr/lib/postgresql/*/bin and PATH")
        + ". Install PostgreSQL 15 (Debian: apt-get install postgresql-15) "
        "or set PG_BINDIR to the directory holding initdb and pg_ctl."
    )


def _major(name: str) -> int:
    try:
        return int(name.split(".")[0])
    except ValueError:
        return 0


# -- running as an unprivileged user ---------------------------------------------------


def _service_user() -> str | None:
    """The OS user that runs the cluster: None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", SERVICE_USER_FALLBACK):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    proc = subprocess.run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            SERVICE_USER_FALLBACK,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        with contextlib.suppress(KeyError):  # created concurrently (xdist worker)
            pwd.getpwnam(SERVICE_USER_FALLBACK)
            return SERVICE_USER_FALLBACK
        raise PostgresSetupError(
            "running as root, and initdb refuses root; no 'postgres' user exists and "
            f"creating '{SERVICE_USER_FALLBACK}' with useradd failed: {proc.stderr.strip()}"
        )
    return SERVICE_USER_FALLBACK


def _run(cmd: list[str], os_user: str | None, cwd: Path, timeout: float = 60) -> str:
    env = dict(os.environ)
    env.pop("PGDATA", None)
    env["LC_ALL"] = "C.UTF-8" if os.path.exists("/usr/lib/locale/C.utf8") else "C"
    kwargs: dict[str, Any] = {}
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        env.update(HOME=str(cwd), USER=os_user, LOGNAME=os_user)
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )
    if proc.returncode != 0:
        raise PostgresSetupError(
            f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return str(proc.stdout)


def _tmp_base(os_user: str | None) -> str | None:
    """A temp parent the service user can traverse (pytest's own tmp dirs are 0700)."""
    base = tempfile.gettempdir()
    if os_user is not None and not (os.stat(base).st_mode & 0o001):
        return "/tmp"
    return base


# -- the cluster -----------------------------------------------------------------------


@contextlib.contextmanager
def running_postgres(dbname: str = "e2e") -> Iterator[PostgresServer]:
    """Start a throw-away cluster, yield it, stop it and delete its files."""
    bin_dir = find_bin_dir()
    os_user = _service_user()
    root = Path(tempfile.mkdtemp(prefix="mapper-state-pg-", dir=_tmp_base(os_user)))
    data_dir, socket_dir, log_file = root / "data", root / "sock", root / "server.log"
    socket_dir.mkdir()
    password = "pw-" + secrets.token_hex(8)
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if os_user is not None:
        entry = pwd.getpwnam(os_user)
        for p in (root, socket_dir, pwfile):
            os.chown(p, entry.pw_uid, entry.pw_gid)
    started = False
    try:
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "--no-instructions",
            ],
            os_user,
            root,
        )
        pwfile.unlink()
        last_error: Exception | None = None
        for _attempt in range(3):  # the free port can be taken between probe and bind
            port = free_port()
            opts = (
                f"-h 127.0.0.1 -p {port} -k {socket_dir} -F "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=50 -c shared_buffers=32MB"
            )
            try:
                _run(
                    [
                        str(bin_dir / "pg_ctl"),
                        "start",
                        "-w",
                        "-t",
                        "60",
                        "-D",
                        str(data_dir),
                        "-l",
                        str(log_file),
                        "-o",
                        opts,
                    ],
                    os_user,
                    root,
                    timeout=90,
                )
                started = True
                break
            except PostgresSetupError as exc:
                last_error = exc
        if not started:
            log = log_file.read_text(errors="replace") if log_file.exists() else ""
            raise PostgresSetupError(f"{last_error}\nserver log:\n{log[-4000:]}")
        server = PostgresServer(  # how to reach it, as whom, and where its files are
            host="127.0.0.1",
            port=port,
            socket_dir=socket_dir,
            dbname=dbname,
            user="postgres",
            password=password,
            os_user=os_user,
            bin_dir=bin_dir,
            data_dir=data_dir,
            log_file=log_file,
        )
        # pg_ctl detaches the server: a watchdog stops it (immediate shutdown) if we die
        with killed_if_we_die(data_dir / "postmaster.pid", signal.SIGQUIT):
            server.create_database(dbname)
            yield server
    finally:
        if started:
            with contextlib.suppress(Exception):
                _run(
                    [str(bin_dir / "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", str(data_dir)],
                    os_user,
                    root,
                )
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class PostgresLocation:
    """A fresh table on a cluster, as a store location (like ``tests.servers.StoreLocation``)."""

    server: PostgresServer
    table: str

    @property
    def uri(self) -> str:
        return self.server.uri(self.table)

    @property
    def options(self) -> dict[str, str]:
        return {"password": self.server.password}

    @property
    def env(self) -> dict[str, str]:
        """Environment for a ``mapper-state`` child process using this location."""
        return {
            "MAPPER_STATE_STATE_BACKEND__URI": self.uri,
            "MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD": self.server.password,
        }

    @property
    def config(self) -> dict[str, Any]:
        """A ``--config`` file's content for this location."""
        return {"state_backend": {"uri": self.uri, "postgres": self.options}}

    def open(self, uri: str | None = None, **overrides: Any) -> Any:  # -> PostgresStore
        """A new client on this location (or on ``uri``), as another process would open it."""
        from mapper_state.stores import open_store

        return open_store(uri or self.uri, {"postgres": {**self.options, **overrides}})

    def rows(self) -> list[tuple[str, bytes, int]]:
        """The table's rows (key, data, version), read without mapper-state (none: no table)."""
        name = f'public."{self.table}"'
        if self.server.query("SELECT to_regclass(%s)", (name,)) == [(None,)]:
            return []
        return [
            (str(k), bytes(d), int(v))
            for k, d, v in self.server.query(
                f'SELECT key, data, version FROM public."{self.table}" ORDER BY key'
            )
        ]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throw-away PostgreSQL cluster (127.0.0.1, a free port) with an empty database."""
    try:
        cm = running_postgres()
        server = cm.__enter__()
    except (PostgresSetupError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot start the throw-away PostgreSQL cluster: {exc}", pytrace=False)
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def pg_location(postgres: PostgresServer) -> PostgresLocation:
    """A fresh table name in the session's cluster (the store creates the table)."""
    return PostgresLocation(postgres, "objects_" + secrets.token_hex(6))
