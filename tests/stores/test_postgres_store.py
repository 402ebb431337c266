"""The PostgreSQL store against a real PostgreSQL 15: the contracts, plus what only it promises.

The session's throw-away cluster (``tests/pg.py``) serves the contracts, with a fresh
table per test; the tests that restart or freeze the server start a cluster of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from mapper_state.core.lease import Lease, lease_key
from mapper_state.errors import ConfigError
from mapper_state.meltano.env import from_meltano_uri
from mapper_state.meltano.policy import meltano_owns_state
from mapper_state.redact import uri_secrets
from mapper_state.settings import Settings
from mapper_state.stores import open_store
from mapper_state.stores.base import PreconditionFailed, StoreAccessDenied, StoreError
from mapper_state.stores.postgres.store import PostgresStore, from_uri
from tests.contract.location_contract import OnLocation
from tests.helpers import clean_env, race_for_one_lease, run_cli, spawn_cli, state_line, wait_until
from tests.pg import PostgresLocation, PostgresServer, running_postgres
from tests.servers import StoreLocation, free_port
from tests.support.cli import one_line_error


class TestPostgresStore(OnLocation):
    @pytest.fixture
    def location(self, pg_location: PostgresLocation) -> PostgresLocation:
        return pg_location


# -- helpers ---------------------------------------------------------------------------


def pg_env(location: PostgresLocation, **extra: str) -> dict[str, str]:
    """A child's environment on ``location``, with no libpq settings of the test runner's."""
    env = {k: v for k, v in clean_env(**location.env).items() if not k.startswith("PG")}
    env["PGPASSFILE"] = os.devnull  # no ~/.pgpass of the machine's either
    env.update(extra)
    return env


def regclass(server: PostgresServer, name: str) -> str | None:
    ((found,),) = server.query("SELECT to_regclass(%s)::text", (name,))
    return None if found is None else str(found)


def open_as(location: PostgresLocation, user: str, password: str, **kw: Any) -> PostgresStore:
    uri = location.server.uri(location.table, user=user)
    return from_uri(uri.removeprefix("postgresql://"), {"password": password}, **kw)


@pytest.fixture
def own_cluster() -> Iterator[PostgresServer]:
    """A cluster for this test alone, which it may restart or freeze."""
    with running_postgres("store") as server:
        yield server


# -- the table -------------------------------------------------------------------------


def test_the_table_is_created_by_the_first_write(pg_location: PostgresLocation) -> None:
    server, name = pg_location.server, f"public.{pg_location.table}"
    store = pg_location.open()
    assert store.read("id/state.json") is None  # reading creates nothing
    assert list(store.list()) == []
    store.delete("id/state.json")
    assert regclass(server, name) is None
    version = store.create("id/state.json", b"{}")
    assert regclass(server, name) == pg_location.table
    columns = server.query(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_name = %s ORDER BY ordinal_position",
        (pg_location.table,),
    )
    assert columns == [
        ("key", "text"),
        ("data", "bytea"),
        ("version", "bigint"),
        ("created_at", "timestamp with time zone"),
        ("updated_at", "timestamp with time zone"),
    ]
    assert pg_location.rows() == [("id/state.json", b"{}", int(version))]
    # no transaction is left open by anything the store did
    idle = server.query(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'mapper-state'"
        " AND state <> 'idle'"
    )
    assert idle == [(0,)]


def test_schema_and_table_come_from_the_uri(pg_location: PostgresLocation) -> None:
    server = pg_location.server
    uri = server.uri(schema="mapper_state_test", table="My Objects")
    store = open_store(uri, {"postgres": pg_location.options})
    assert store.display_uri == (
        f"postgresql://postgres@127.0.0.1:{server.port}/{server.dbname}"
        "?schema=mapper_state_test&table=My+Objects"
    )
    store.create("k", b"v")  # the schema is created too
    assert regclass(server, '"mapper_state_test"."My Objects"') == 'mapper_state_test."My Objects"'
    default = open_store(server.uri(), {"postgres": pg_location.options})
    assert default.display_uri == f"postgresql://postgres@127.0.0.1:{server.port}/e2e"
    assert default.table_name == "public.mapper_state_objects"  # type: ignore[attr-defined]


def test_racing_first_writes_create_the_table_once(pg_location: PostgresLocation) -> None:
    stores = [pg_location.open() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def first_write(i: int) -> None:
        barrier.wait()
        try:
            stores[i].create(f"id-{i}/state.json", b"{}")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=first_write, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(pg_location.rows()) == len(stores)


# -- versions and keys -----------------------------------------------------------------


def test_versions_never_repeat_even_after_delete_and_recreate(
    pg_location: PostgresLocation,
) -> None:
    store = pg_location.open()
    seen = [store.create("id/lease", b"same")]
    seen.append(store.replace("id/lease", b"same", if_version=seen[-1]))
    store.delete("id/lease", if_version=seen[-1])
    seen.append(store.create("id/lease", b"same"))  # the same key and bytes again
    assert len(set(seen)) == len(seen)
    assert [int(v) for v in seen] == sorted(int(v) for v in seen)
    for stale in seen[:-1]:
        with pytest.raises(PreconditionFailed):
            store.replace("id/lease", b"late", if_version=stale)
        with pytest.raises(PreconditionFailed):
            store.delete("id/lease", if_version=stale)
    with pytest.raises(PreconditionFailed):
        store.replace("id/lease", b"x", if_version="not-a-version-of-this-store")
    # even a table dropped and created again does not hand out an old version
    pg_location.server.execute(f'DROP TABLE public."{pg_location.table}"')
    again = store.create("id/lease", b"same")
    assert int(again) > int(seen[-1])


def test_list_escapes_like_wildcards_in_the_prefix(pg_location: PostgresLocation) -> None:
    store = pg_location.open()
    keys = ["a_b/x", "aXb/x", "a%b/y", "a%bc/z", "abc/q", "a\\b/w", "a\\\\b/v"]
    for key in keys:
        store.create(key, b"{}")
    assert sorted(store.list("a_b/")) == ["a_b/x"]
    assert sorted(store.list("a%b")) == ["a%b/y", "a%bc/z"]
    assert sorted(store.list("a\\b")) == ["a\\b/w"]
    assert sorted(store.list("a")) == sorted(keys)
    assert sorted(store.list("%")) == []
    assert sorted(store.list("_")) == []


def test_list_pages_through_many_keys(pg_location: PostgresLocation) -> None:
    uri = pg_location.uri.removeprefix("postgresql://")
    store = from_uri(uri, pg_location.options, page_size=3)
    keys = [f"id-{i:02d}/state.json" for i in range(11)]
    for key in keys:
        store.create(key, b"{}")
    store.create("other/state.json", b"{}")
    assert list(store.list("id-")) == keys
    assert sorted(store.list()) == sorted([*keys, "other/state.json"])


def test_a_create_whose_answer_was_lost_is_not_a_conflict(pg_location: PostgresLocation) -> None:
    """The INSERT commits but the connection dies before its answer arrives: the retry finds
    the row, with our bytes, and returns its version instead of "already exists"."""
    store = pg_location.open()
    store.create("warm-up", b"")  # the table exists: the next INSERT is one statement
    conn = store.link.connection
    assert conn is not None
    real_execute = conn.execute
    calls: list[str] = []

    def lose_the_answer(query: Any, params: Any = None, **kw: Any) -> Any:
        result = real_execute(query, params, **kw)
        if not calls and isinstance(query, sql.Composed) and "INSERT" in query.as_string(conn):
            calls.append("lost")  # committed (autocommit); now the connection dies
            real_execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return result

    conn.execute = lose_the_answer
    version = store.create("id/mapper-state.lease.json", b"mine")
    assert calls == ["lost"]
    blob = pg_location.open().read("id/mapper-state.lease.json")
    assert blob is not None
    assert blob.data == b"mine"
    assert blob.version == version


# -- settings, passwords, errors ---------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("postgresql://u:s3cr3t-pw@h/db?bogus=1", 'invalid URI query parameter: "bogus"'),
        ("postgresql://u:s3cr%zzet@h/db", "invalid percent-encoded token"),
        ("postgresql://u@h/db?table=", "empty table"),
        ("postgresql://u@h/db?schema=" + "x" * 64, "longer than 63 bytes"),
    ],
)
def test_bad_uris_are_config_errors_without_the_password(uri: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store(uri, {"postgres": {"password": "setting-pw"}})
    message = caught.value.message
    assert named in message
    assert "state_backend.uri" in message
    assert "s3cr" not in message
    assert "setting-pw" not in message
    assert "\n" not in message


def test_password_sources_in_order(pg_location: PostgresLocation, tmp_path: Path) -> None:
    """The URI's password, else the setting, else libpq's own (PGPASSWORD, a pgpass file,
    a service file); each works through the command line."""
    server = pg_location.server
    pw = server.password
    host = f"127.0.0.1:{server.port}/{server.dbname}"
    table = f"table={pg_location.table}"
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{server.port}:{server.dbname}:postgres:{pw}\n")
    pgpass.chmod(0o600)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[states]\nhost=127.0.0.1\nport={server.port}\ndbname=e2e\nuser=postgres\n"
    )
    cases = [
        ({"MAPPER_STATE_STATE_BACKEND__URI": f"postgresql://postgres:{pw}@{host}?{table}"}, "uri"),
        (
            {
                "MAPPER_STATE_STATE_BACKEND__URI": f"postgresql://postgres:{pw}@{host}?{table}",
                "MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD": "wrong-but-outranked",
            },
            "uri over setting",
        ),
        (pg_location.env, "setting"),
        (
            {
                "MAPPER_STATE_STATE_BACKEND__URI": pg_location.uri,
                "MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD": pw,
                "PGPASSWORD": "wrong-but-outranked",
            },
            "setting over PGPASSWORD",
        ),
        ({"MAPPER_STATE_STATE_BACKEND__URI": pg_location.uri, "PGPASSWORD": pw}, "PGPASSWORD"),
        ({"MAPPER_STATE_STATE_BACKEND__URI": pg_location.uri, "PGPASSFILE": str(pgpass)}, "pgpass"),
        (
            {
                "MAPPER_STATE_STATE_BACKEND__URI": f"postgresql:///?service=states&{table}",
                "PGSERVICEFILE": str(services),
                "PGPASSFILE": str(pgpass),
            },
            "service file",
        ),
    ]
    for i, (env, how) in enumerate(cases):
        base = {k: v for k, v in clean_env().items() if not k.startswith("PG")}
        base.setdefault("PGPASSFILE", os.devnull)
        result = run_cli("state", "set", f"by-{i}", json.dumps({"how": how}), env={**base, **env})
        assert result.returncode == 0, (how, result.stderr)
    assert {k for k, _, _ in pg_location.rows() if k.endswith("state.json")} == {
        f"by-{i}/state.json" for i in range(len(cases))
    }


def test_a_wrong_password_is_exit_5_naming_the_setting(pg_location: PostgresLocation) -> None:
    wrong = "wrong-password-4711"
    for env in (
        pg_env(pg_location, MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD=wrong),
        pg_env(
            pg_location,
            MAPPER_STATE_STATE_BACKEND__URI=pg_location.server.uri(pg_location.table).replace(
                "postgres@", f"postgres:{wrong}@"
            ),
        ),
    ):
        result = run_cli("--state-id", "dev:tap-to-target", env=env, input=state_line({"a": 1}))
        err = result.stderr.decode()
        assert result.returncode == 5, err
        one_line_error(
            err,
            "PostgreSQL refused the connection as postgres",
            "password authentication failed",
            "state_backend.postgres.password",
        )
        assert wrong not in err
        assert result.stdout == b""
        assert "attempts" not in err, "credentials refused are not retried"
    # no password at all: libpq finds none, the server asks for one
    nothing = {k: v for k, v in pg_env(pg_location).items() if "PASSWORD" not in k}
    result = run_cli("state", "list", env=nothing)
    assert result.returncode == 5, result.stderr
    assert b"state_backend.postgres.password" in result.stderr


def test_the_password_never_appears_in_any_output(
    pg_location: PostgresLocation, tmp_path: Path
) -> None:
    """Password in the URI on the command line: not in stdout, stderr, --about, doctor, the
    busy error, nor in what the store keeps (the lease's and history's command lines)."""
    pw = pg_location.server.password
    uri = pg_location.uri.replace("postgres@", f"postgres:{pw}@")
    env = {k: v for k, v in pg_env(pg_location).items() if "PASSWORD" not in k}
    flag = ("--state-backend-uri", uri)
    outputs: list[bytes] = []
    holder = spawn_cli("--state-id", "p", *flag, env=env)
    wait_until(
        lambda: any(k == "p/mapper-state.lease.json" for k, _, _ in pg_location.rows()), "the lease"
    )
    for args in (
        ("--state-id", "p", *flag),  # busy: names the holder and its command line
        ("lock", "status", "p", *flag),
        ("lock", "status", "p", "--format", "json", *flag),
        ("state", "list", "--format", "json", *flag),
        ("doctor", *flag),
        ("doctor", "--format", "json", *flag),
        ("--about", *flag),
        ("--about", "--format", "json", *flag),
    ):
        result = run_cli(*args, env=env)
        assert result.returncode == (3 if args[0] == "--state-id" else 0), (args, result.stderr)
        outputs += [result.stdout, result.stderr]
    assert b"is busy: held by run" in outputs[1]
    assert b"verdict: the store is safe for locking." in b"".join(outputs)
    out, err = holder.communicate(state_line({"x": 1}), timeout=60)
    assert holder.returncode == 0, err
    outputs += [out, err]
    for args in (("state", "history", "p"), ("state", "get", "p")):
        result = run_cli(*args, *flag, env=env)
        assert result.returncode == 0, result.stderr
        outputs += [result.stdout, result.stderr]
    # a store that cannot be reached says where, not with what
    gone = uri.replace(f":{pg_location.server.port}/", f":{free_port()}/")
    failed = run_cli(
        "state", "list", "--state-backend-uri", gone, "--lock-timeout-seconds", "3", env=env
    )
    assert failed.returncode == 5
    assert b"cannot reach PostgreSQL" in failed.stderr
    assert b"attempts" in failed.stderr
    outputs += [failed.stdout, failed.stderr]
    leaks = [o.decode(errors="replace") for o in outputs if pw.encode() in o]
    assert leaks == []
    stored = b"".join(data for _, data, _ in pg_location.rows())
    assert b'"command"' in stored
    assert pw.encode() not in stored


def test_a_role_without_create_gets_one_line_naming_the_privilege(
    pg_location: PostgresLocation,
) -> None:
    server = pg_location.server
    role = "reader_" + pg_location.table[-6:]
    server.create_role(role, "reader-pw")  # PostgreSQL 15: no CREATE on schema public
    store = open_as(pg_location, role, "reader-pw")
    assert store.read("id/state.json") is None
    with pytest.raises(StoreAccessDenied) as caught:
        store.create("id/state.json", b"{}")
    message = caught.value.message
    assert message.startswith(f"the PostgreSQL role {role} may not create the table public.")
    assert "it lacks CREATE on schema public" in message
    assert "\n" not in message

    env = pg_env(
        pg_location,
        MAPPER_STATE_STATE_BACKEND__URI=server.uri(pg_location.table, user=role),
        MAPPER_STATE_STATE_BACKEND__POSTGRES__PASSWORD="reader-pw",
    )
    result = run_cli("--state-id", "x", env=env, input=state_line({"a": 1}))
    err = result.stderr.decode()
    assert result.returncode == 5, err
    assert err.count("\n") == 1, err
    assert "lacks CREATE on schema public" in err
    doctor = run_cli("doctor", env=env)
    assert doctor.returncode == 5
    assert b"lacks CREATE on schema public" in doctor.stdout

    # the table exists (its owner made it) but the role may only read it
    pg_location.open().create("id/state.json", b"{}")
    server.execute(f'GRANT SELECT ON public."{pg_location.table}" TO {role}')
    assert store.read("id/state.json") is not None
    assert store.list("id/").__next__() == "id/state.json"
    with pytest.raises(StoreAccessDenied) as caught:
        store.create("id/lease", b"{}")
    assert f"lacks INSERT on public.{pg_location.table}, USAGE on sequence" in caught.value.message
    with pytest.raises(StoreAccessDenied, match=f"lacks DELETE on public.{pg_location.table} for"):
        store.delete("id/state.json")

    # the grants the README gives are all it needs
    table = f'public."{pg_location.table}"'
    server.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
    server.execute(f'GRANT USAGE ON SEQUENCE public."{pg_location.table}_version_seq" TO {role}')
    version = store.create("id/lease", b"1")
    version = store.replace("id/lease", b"2", if_version=version)
    store.delete("id/lease", if_version=version)
    assert run_cli("doctor", env=env).returncode == 0


def test_doctor_passes_through_the_cli(pg_location: PostgresLocation) -> None:
    result = run_cli("doctor", "--format", "json", env=pg_env(pg_location))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "safe"
    assert report["store"] == pg_location.server.uri(pg_location.table)
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "reachable": "ok",
        "credentials accepted": "ok",
        "read": "ok",
        "write": "ok",
        "list": "ok",
        "delete": "ok",
        "create-if-absent": "ok",
        "compare-and-swap": "ok",
        "conditional delete": "ok",
        "release": "ok",
        "operator delete": "ok",
    }
    assert pg_location.rows() == []  # it cleaned up


def test_racing_processes_never_have_two_holders(
    pg_location: PostgresLocation, tmp_path: Path
) -> None:
    race_for_one_lease(tmp_path, pg_env(pg_location))
    assert [k for k, _, _ in pg_location.rows() if k.startswith("race/mapper-state.lease")] == []


# -- failures of the server ----------------------------------------------------------------


def test_a_server_restart_while_a_lease_is_held_is_transient(
    own_cluster: PostgresServer, tmp_path: Path
) -> None:
    """pg_ctl restart under a running filter: its next renewal reconnects and succeeds, and
    the run commits and exits 0."""
    location = PostgresLocation(own_cluster, "objects")
    env = pg_env(location)
    ttl = "6"  # renewals every 2 s, each may retry for 2 s
    holder = spawn_cli("--state-id", "r", "--lock-timeout-seconds", ttl, env=env, cwd=tmp_path)
    store = location.open()
    wait_until(lambda: store.read(lease_key("r")) is not None, "the lease", timeout=30)
    first = store.read(lease_key("r"))
    assert first is not None
    started = time.monotonic()
    own_cluster.restart()
    restart_seconds = time.monotonic() - started
    # renewals after the restart have moved the lease on
    wait_until(
        lambda: (b := store.read(lease_key("r"))) is not None and b.version != first.version,
        "a renewal after the restart",
        timeout=20,
    )
    time.sleep(float(ttl))  # past the TTL: only renewals can have kept it
    _out, err = holder.communicate(state_line({"after": "restart"}), timeout=60)
    assert holder.returncode == 0, err
    assert b"lost the lease" not in err
    got = run_cli("state", "get", "r", env=env)
    assert json.loads(got.stdout) == {"after": "restart"}, got.stderr
    print(f"pg_ctl restart took {restart_seconds:.2f} s")


def test_a_stuck_server_cannot_hold_a_call_past_the_deadline(
    pg_location: PostgresLocation,
) -> None:
    """A row lock (statement_timeout) and a frozen server process (the watchdog): the call
    fails within its deadline, and the store works again afterwards."""
    server = pg_location.server
    uri = (
        pg_location.uri.removeprefix("postgresql://")
        + "&application_name=frozen-"
        + pg_location.table
    )
    store = from_uri(uri, pg_location.options, retry_deadline_seconds=2)
    version = store.create("id/lease", b"1")

    with server.connect() as other, other.transaction():
        other.execute(f'SELECT * FROM public."{pg_location.table}" FOR UPDATE')
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"did not finish replace of id/lease .* within 2 s"):
            store.replace("id/lease", b"2", if_version=version)
        assert time.monotonic() - started < 2 + 20  # a bound, not a benchmark: else it hangs
    version = store.replace("id/lease", b"2", if_version=version)

    (pid,) = server.backend_pids("frozen-" + pg_location.table)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match="PostgreSQL gave no answer to replace of id/lease"):
            store.replace("id/lease", b"3", if_version=version)
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 2 + 20, elapsed  # a bound, not a benchmark: else it hangs
    # A new connection works. The frozen process had received the UPDATE before it was
    # stopped: thawed, it may still apply it, as any write whose answer was lost may land;
    # the version check keeps that harmless (a takeover in between makes it fail).
    blob = store.read("id/lease")
    assert blob is not None
    assert blob.data in (b"2", b"3")


def test_a_frozen_server_cannot_keep_the_heartbeat_from_giving_the_lease_up(
    own_cluster: PostgresServer,
) -> None:
    """The whole server stops (SIGSTOP, as a hung host would): every renewal fails within its
    deadline instead of hanging, and the heartbeat calls the lease lost soon after its expiry."""
    location = PostgresLocation(own_cluster, "objects")
    ttl = 3.0
    # what the registry does: a third of the TTL for each call
    store = from_uri(
        location.uri.removeprefix("postgresql://"), location.options, retry_deadline_seconds=ttl / 3
    )
    lease = Lease(store, "frozen", ttl=ttl)
    lease.acquire()
    lost = threading.Event()
    lease.start_heartbeat(on_lost=lambda _exc: lost.set())
    pids = own_cluster.processes()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        # renewals every ttl/3, each given up after its deadline (a new connection may take
        # libpq's 2 s minimum): lost at the first failure past the expiry
        assert lost.wait(ttl + ttl / 3 + 2 + 2), "the heartbeat never gave the lease up"
        print(
            f"lease lost {time.monotonic() - started:.2f} s after the server froze (TTL {ttl:g} s)"
        )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert lease.lost is not None
    lease.release()  # leaves the (now expired) lease alone: it may no longer be ours


# -- migrating and Meltano ---------------------------------------------------------------


STATES = {
    "dev:tap-a-to-target-b": {"bookmarks": {"a": {"replication_key_value": 1}}},
    "prod:tap-c-to-target-d": {"bookmarks": {"c": {"replication_key_value": "2024-01-01"}}},
}


def _seed(env: dict[str, str]) -> None:
    for state_id, value in STATES.items():
        result = run_cli("state", "set", state_id, json.dumps(value), env=env)
        assert result.returncode == 0, result.stderr


def _migrate(source: dict[str, str], target: dict[str, str]) -> None:
    exported = run_cli("state", "export", env=source)
    assert exported.returncode == 0, exported.stderr
    imported = run_cli("state", "import", env=target, input=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    listed = run_cli("state", "list", env=target)
    assert listed.stdout.decode().split() == sorted(STATES)
    for state_id, value in STATES.items():
        got = run_cli("state", "get", state_id, "--format", "json", env=target)
        assert json.loads(got.stdout) == value, got.stderr


def test_state_export_import_migrates_to_and_from_a_file_store(
    pg_location: PostgresLocation, tmp_path: Path
) -> None:
    ours = pg_env(pg_location)
    files = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path / 'files'}")
    _seed(ours)
    _migrate(ours, files)
    back = PostgresLocation(pg_location.server, pg_location.table + "_back")
    _migrate(files, pg_env(back))


def test_state_export_import_migrates_to_and_from_s3(
    pg_location: PostgresLocation, s3_location: StoreLocation
) -> None:
    ours = pg_env(pg_location)
    bucket = clean_env(**s3_location.env)
    _seed(ours)
    _migrate(ours, bucket)
    back = PostgresLocation(pg_location.server, pg_location.table + "_back")
    _migrate(bucket, pg_env(back))


def test_meltano_reads_a_plugin_backends_postgres_uri_as_another_layout() -> None:
    """A Meltano state-backend plugin on PostgreSQL keeps its own table: the same URI names
    the same server, not the same state, so mapper-state does not go lock-only on it, and
    the URI keeps its user (only S3 URIs carry credentials to take apart)."""
    uri = "postgresql://meltano:pw-in-uri@db.example:5432/meltano"
    assert from_meltano_uri(uri) == uri
    assert uri_secrets(uri) == ["pw-in-uri"]
    assert uri_secrets("postgresql://meltano@db/x") == []
    assert uri_secrets("postgresql://db/x?sslmode=require&password=p%40ss") == ["p%40ss", "p@ss"]
    env = {
        "MELTANO_MAP__MAPPING_NAME": "remote-state",
        "MELTANO_ENVIRONMENT": "dev",
        "MELTANO_EXTRACTOR_NAME": "tap-postgres",
        "MELTANO_STATE_BACKEND_URI": uri,
    }
    settings = Settings(
        {
            "state_id": "dev:tap-postgres-to-target-jsonl",
            "state_backend.uri": uri,
            "lock_only": None,
        }
    )
    assert meltano_owns_state(settings, env) is False


def test_opening_other_stores_imports_no_psycopg() -> None:
    code = (
        "import sys, tempfile\n"
        "from mapper_state.stores import open_store, store_settings\n"
        "store_settings()\n"
        "open_store('file://' + tempfile.mkdtemp()).list()\n"
        "assert 'psycopg' not in sys.modules, 'psycopg imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
