"""Hostile state IDs and settings: a one-line error (exit 2), never a traceback, on every store.

Traversal (``../x``, ``a/./b``), absolute (``/abs``), empty segments (``a//b``), NUL and
control characters, backslashes and over-long IDs are refused by every command that takes
a state ID, before anything is read or written, whichever store the URI names. Random IDs,
random settings (flags, ``--set``, environment, config files) and random values either
work or fail with one line naming the problem.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mapper_state.cli import main
from mapper_state.config import catalog
from tests.chaos import cli
from tests.chaos.conftest import BUDGET, STORES, file_location, location_for
from tests.helpers import MAPPER, TINY_TAP, clean_env, tiny_target
from tests.servers import StoreLocation
from tests.support.cli import one_line_error

BAD_IDS = [
    "../x",
    "x/../../etc",
    "/abs",
    "a\x00b",
    "a\x01b",
    "a\nb",
    "a\x7fb",
    "a/./b",
    "a//b",
    "a\\..\\b",
    ".",
    "..",
    "x/",
    "x" * 600,
]


def process_commands(state_id: str, tmp: Path) -> list[list[str]]:
    """The commands that stream or write, run as real processes.

    A NUL cannot travel in an argument or an environment variable, so it comes in a
    ``--config`` file (for the filter and ``run``), as from a Meltano mapping's config.
    """
    tap, target = TINY_TAP, tiny_target(tmp / "o")
    config = tmp / "bad-id.json"
    config.write_text(json.dumps({"state_id": state_id}))
    via_config = [
        ["--config", str(config)],
        ["run", "--config", str(config), "--tap", tap, "--target", target],
    ]
    if "\x00" in state_id:
        return via_config
    return [
        *via_config,
        ["--state-id", state_id],
        ["state", "set", state_id, '{"bookmarks": {"s": 1}}'],
    ]


def operator_commands(state_id: str) -> list[list[str]]:
    """The other commands that take a state ID, run in this process (a NUL is fine here)."""
    return [
        ["state", "get", state_id],
        ["state", "merge", state_id, '{"bookmarks": {"s": 1}}'],
        ["state", "clear", state_id, "--yes"],
        ["state", "history", state_id],
        ["state", "diff", state_id],
        ["lock", "status", state_id],
        ["lock", "break", state_id, "--yes"],
        ["state", "copy", "fine", state_id],
        ["state", "move", state_id, "fine"],
    ]


@pytest.mark.parametrize("kind", STORES)
def test_bad_state_ids_are_refused_on_every_store(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    if kind == "file":
        location: StoreLocation = file_location(tmp_path / "store")
    else:
        request.applymarker(pytest.mark.cloud)
        location = location_for(request, kind)
    direct = location.open()
    before = sorted(direct.list())
    as_processes = BAD_IDS if BUDGET.full or kind == "file" else BAD_IDS[::3]
    for state_id in BAD_IDS:
        for args in operator_commands(state_id):
            result = invoke(args, env=location.env)
            assert_clean(result, 2)
            assert "state ID" in result.stderr or "state_id" in result.stderr, result.stderr
        if state_id not in as_processes:
            continue
        for args in process_commands(state_id, tmp_path):
            proc = subprocess.run(
                [MAPPER, *args], input=b'{"type":"STATE","value":{"x":1}}\n', capture_output=True,
                env=cli.env_for(location), timeout=60, check=False,
            )  # fmt: skip
            shown = f"{args[:3]!r} on {kind}"
            assert proc.returncode == 2, f"{shown}: exit {proc.returncode}: {proc.stderr!r}"
            line = one_line_error(proc.stderr)
            assert "state ID" in line or "state_id" in line, f"{shown}: {line}"
            assert proc.stdout == b"", f"{shown}: passed data on without a valid ID"
    assert sorted(direct.list()) == before, "a refused state ID still wrote to the store"


# -- random state IDs and settings, in process --------------------------------------------


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    runner = CliRunner()
    return runner.invoke(main, args, env=env, catch_exceptions=True)


def assert_clean(result: Any, *allowed: int) -> None:
    """Exit in ``allowed``; a failure is one line on stderr; no exception escaped."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), (
        f"{type(exc).__name__}: {exc}\n{result.output}"
    )
    assert result.exit_code in allowed, (result.exit_code, result.stderr)
    if result.exit_code:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert "Traceback" not in result.stderr


state_ids = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(list("ab./\\:-_ \x00\x01\n\t\x7f\u2028é☃")), max_size=12),
    st.sampled_from(BAD_IDS),
    st.integers(500, 700).map(lambda n: "y" * n),
)


@settings(max_examples=BUDGET.examples)
@given(state_id=state_ids)
def test_any_state_id_works_or_is_one_line(tmp_path_factory: Any, state_id: str) -> None:
    store = tmp_path_factory.mktemp("ids")
    for args in (["state", "get", state_id], ["lock", "status", state_id]):
        result = invoke([*args, "--state-backend-uri", f"file://{store}"])
        assert_clean(result, 0, 2, 10)


SETTINGS = [spec for spec in catalog() if spec.name != "state_backend.uri"]
hostile_values = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["-1", "0", "1e309", "nan", "inf", "true", "[]", "{}", "{", "null", "\x00", "   "]
    ),
    st.integers(-(10**20), 10**20).map(str),
    st.floats().map(str),
)
safe_uris = st.sampled_from(
    ["file://{root}", "file:{root}", "{root}", "bogus://x", "s3://", "gs://", "azure://", "",
     "file://", "postgresql://u:pw@127.0.0.1:1/db", "s3:///x"]
)  # fmt: skip


@settings(max_examples=BUDGET.examples)
@given(
    flags=st.lists(st.tuples(st.sampled_from(SETTINGS), hostile_values), max_size=4),
    env=st.lists(st.tuples(st.sampled_from(SETTINGS), hostile_values), max_size=3),
    file_settings=st.dictionaries(
        st.sampled_from([s.name for s in SETTINGS]),
        hostile_values | st.integers() | st.booleans() | st.none(),
        max_size=3,
    ),
    uri=safe_uris,
)
# found by this test: a region botocore refuses was an internal error (exit 1)
@example(flags=[], env=[], file_settings={"state_backend.s3.region": "0"}, uri="s3:///x")
@example(
    flags=[], env=[], file_settings={"state_backend.s3.endpoint_url": "http://a b"}, uri="s3:///x"
)
def test_any_settings_work_or_fail_in_one_line(
    tmp_path_factory: Any, flags: list[Any], env: list[Any], file_settings: dict[str, Any], uri: str
) -> None:
    """No network: only URIs that name no server, or a cloud URI missing its bucket.

    Where no source sets the lease's length, the config file makes it short: a refused
    connection is retried for a third of it (10 s by default, a second here)."""
    root = tmp_path_factory.mktemp("settings")
    config = root / "config.json"
    config.write_text(json.dumps({"state_backend.lock_timeout_seconds": 3, **file_settings}))
    args = ["state", "list", "--state-backend-uri", uri.format(root=root), "--config", str(config)]
    for spec, value in flags:
        args += ["--set", f"{spec.name}={value}"]
    environment = {spec.env_var: value for spec, value in env if "\x00" not in value}
    environment.update(
        {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true"}
    )
    result = invoke(args, env=environment)
    assert_clean(result, 0, 2, 5)


# -- local files are private ------------------------------------------------------------


def test_local_files_and_temp_files_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    """State, lease, history, lock sidecars, the run's state file and --state-file: 0600."""
    store = tmp_path / "store"
    report = tmp_path / "tap-report.json"
    tap, target = TINY_TAP, tiny_target(tmp_path / "o")
    env = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{store}", TINY_TAP_REPORT=str(report))
    old = os.umask(0)
    try:
        for args in (
            ["state", "set", "p", '{"bookmarks": {"s": 1}}'],
            ["run", "--state-id", "p", "--tap", tap, "--target", target],
            ["--state-id", "q", "--state-file", str(tmp_path / "handed.json")],
        ):
            proc = subprocess.run(
                [MAPPER, *args], input=b'{"type":"STATE","value":{"bookmarks":{"s":2}}}\n',
                capture_output=True, env=env, timeout=60, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
    finally:
        os.umask(old)
    assert json.loads(report.read_text())["state_file_mode"] == "0o600"
    files = [p for p in store.rglob("*") if p.is_file()]
    assert any(p.name == "state.json" for p in files)
    assert any("history" in p.parts for p in files)
    loose = {str(p.relative_to(store)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert all(mode == "0o600" for mode in loose.values()), loose
    dirs = {
        str(p.relative_to(store)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in store.rglob("*")
        if p.is_dir()
    }
    assert all(mode == "0o700" for mode in dirs.values()), dirs
    assert oct(stat.S_IMODE((tmp_path / "handed.json").stat().st_mode)) == "0o600"


@pytest.mark.parametrize("length", [256, 500])
def test_a_long_state_id_on_the_file_store_works_or_is_one_line(
    tmp_path: Path, length: int
) -> None:
    """An ID under the length limit whose one segment is longer than a file name may be."""
    for args in (["state", "get", "y" * length], ["state", "set", "y" * length, '{"a": 1}']):
        assert_clean(invoke([*args, "--state-backend-uri", f"file://{tmp_path}"]), 0, 2, 5, 10)
