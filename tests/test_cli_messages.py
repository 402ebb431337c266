"""What the command line tells a newcomer: typos named, a missing state ID caught, honest help.

In-process with click's runner: no process boundary is under test here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from mapper_state.cli import main
from mapper_state.core.lease import Lease
from mapper_state.stores import open_store

ROOT = Path(__file__).resolve().parent.parent
#: Every command that opens a store, as typed after ``mapper-state``.
STORE_COMMANDS = [
    ("state", "list"),
    ("state", "get"),
    ("state", "set"),
    ("state", "merge"),
    ("state", "clear"),
    ("state", "copy"),
    ("state", "move"),
    ("state", "export"),
    ("state", "import"),
    ("state", "history"),
    ("state", "diff"),
    ("state", "rollback"),
    ("lock", "status"),
    ("lock", "break"),
    ("doctor",),
]
#: The main commands, whose help shows an example: the filter, ``run``, and the store
#: commands but those that copy or merge states.
HELP_WITH_EXAMPLES: list[tuple[str, ...]] = [
    (),
    ("run",),
    *(c for c in STORE_COMMANDS if c[-1] not in {"merge", "copy", "move", "export", "import"}),
]
READ_ONLY = [
    ("state", "list"),
    ("state", "get"),
    ("state", "history"),
    ("state", "diff"),
    ("lock", "status"),
    ("doctor",),
]
#: What only a command that takes the lease uses. ``--lock-timeout-seconds`` is on every
#: store command: a third of it bounds a store call's retries, reads included.
LEASE_FLAGS = ("--lock-retry-seconds", "--lock-wait-seconds")


@pytest.fixture
def clean_environment() -> Iterator[None]:
    """No MAPPER_STATE_* or MELTANO_* variable of the machine leaks into a test."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("MAPPER_STATE_", "MELTANO_"))}
    for key in saved:
        del os.environ[key]
    yield
    os.environ.update(saved)


def cli(store: Path, *args: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
    runner = CliRunner()
    return runner.invoke(
        main, [*args, "--state-backend-uri", f"file://{store}"], input=stdin, env=env
    )


def error_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# -- a misspelt variable, setting or config key ---------------------------------------------


@pytest.mark.usefixtures("clean_environment")
def test_meltanos_spelling_of_a_variable_is_named_with_the_right_one(tmp_path: Path) -> None:
    result = cli(tmp_path, "state", "list", env={"MAPPER_STATE_STATE_BACKEND_URI": "s3://bucket/x"})
    assert result.exit_code == 0, result.stderr
    assert (
        "warning: ignored the environment variable MAPPER_STATE_STATE_BACKEND_URI: it names no "
        "setting (did you mean MAPPER_STATE_STATE_BACKEND__URI?)"
    ) in result.stderr


@pytest.mark.usefixtures("clean_environment")
def test_a_misspelt_variable_gets_the_closest_setting(tmp_path: Path) -> None:
    result = cli(tmp_path, "state", "list", env={"MAPPER_STATE_HISTORY_KEPP": "3"})
    assert "MAPPER_STATE_HISTORY_KEPP" in result.stderr
    assert "did you mean MAPPER_STATE_HISTORY_KEEP?" in result.stderr


@pytest.mark.usefixtures("clean_environment")
def test_variables_the_project_documents_are_not_reported(tmp_path: Path) -> None:
    env = {
        "MAPPER_STATE_CHAOS": "small",
        "MAPPER_STATE_CHAOS_ROUNDS": "3",
        "MAPPER_STATE_TOOLS_DIR": str(tmp_path),
        "MAPPER_STATE_HISTORY_KEEP": "3",
    }
    result = cli(tmp_path, "state", "list", env=env)
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr


@pytest.mark.usefixtures("clean_environment")
def test_inside_meltano_its_own_spelling_of_our_variables_is_its_business(
    tmp_path: Path,
) -> None:
    env = {"MELTANO_PROJECT_ROOT": str(tmp_path), "MAPPER_STATE_STATE_ID": "dev:x"}
    env["MAPPER_STATE_STATE_BACKEND_URI"] = f"file://{tmp_path}"
    env["MAPPER_STATE_STREAM_MAPS"] = "{}"  # Meltano exports every key of the mapping's config
    result = cli(tmp_path, "state", "list", env=env)
    assert "warning" not in result.stderr, result.stderr
    # our own spelling is still checked there
    env["MAPPER_STATE_STATE_BACKEND__URII"] = "file:///elsewhere"
    result = cli(tmp_path, "state", "list", env=env)
    assert "did you mean MAPPER_STATE_STATE_BACKEND__URI?" in result.stderr


@pytest.mark.usefixtures("clean_environment")
def test_an_unknown_set_name_gets_a_suggestion(tmp_path: Path) -> None:
    result = cli(tmp_path, "state", "list", "--set", "state_backend.urii=file:///x")
    assert result.exit_code == 2
    assert "unknown setting state_backend.urii (did you mean state_backend.uri?)" in error_line(
        result
    )


@pytest.mark.usefixtures("clean_environment")
def test_an_unknown_config_key_gets_a_suggestion(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"state_backend": {"lock_timeout_second": 5}}))
    result = cli(tmp_path, "state", "list", "--config", str(config))
    assert result.exit_code == 2
    assert "did you mean state_backend.lock_timeout_seconds?" in error_line(result)


@pytest.mark.usefixtures("clean_environment")
def test_a_config_key_close_to_a_setting_is_reported_not_silently_dropped(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"histroy_keep": 3, "stream_maps": {}}))
    result = cli(tmp_path, "state", "list", "--config", str(config))
    assert result.exit_code == 0, result.stderr
    assert "ignored the key histroy_keep" in result.stderr
    assert "did you mean history_keep?" in result.stderr
    assert "stream_maps" not in result.stderr  # a key of Meltano's or the SDK's


# -- a forgotten state ID ---------------------------------------------------------------------


@pytest.mark.usefixtures("clean_environment")
def test_a_state_given_where_the_id_goes_is_refused(tmp_path: Path) -> None:
    result = cli(tmp_path, "state", "set", '{"bookmarks": {}}', stdin='{"bookmarks": {}}')
    assert result.exit_code == 2
    assert "did you forget the state ID?" in error_line(result)
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ("state", "get", '{"a": 1}'),
        ("state", "merge", '{"a": 1}', "{}"),
        ("state", "copy", "job", '{"a": 1}'),
        ("state", "history", ' {"a": 1}'),
        ("state", "import", "--state-id", '{"a": 1}'),
        ("lock", "status", "{}"),
    ],
)
@pytest.mark.usefixtures("clean_environment")
def test_every_command_taking_an_id_refuses_a_json_object(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = cli(tmp_path, *args)
    assert result.exit_code == 2
    assert "did you forget the state ID?" in error_line(result)


@pytest.mark.usefixtures("clean_environment")
def test_an_id_with_braces_that_is_not_json_is_still_an_id(tmp_path: Path) -> None:
    assert cli(tmp_path, "state", "set", "{job}", "{}").exit_code == 0
    assert json.loads(cli(tmp_path, "state", "get", "{job}").stdout) == {}


# -- a live lease's expiry --------------------------------------------------------------------


@pytest.mark.usefixtures("clean_environment")
def test_state_list_long_shows_a_live_leases_expiry_in_the_future(tmp_path: Path) -> None:
    assert cli(tmp_path, "state", "set", "job", "{}").exit_code == 0
    lease = Lease(open_store(f"file://{tmp_path}"), "job", ttl=600, run_id="nightly-42")
    lease.acquire()
    try:
        listed = cli(tmp_path, "state", "list", "--long")
        status = cli(tmp_path, "lock", "status", "job")
    finally:
        lease.release()
    row = next(line for line in listed.stdout.splitlines() if line.startswith("job "))
    assert "nightly-42" in row
    assert "(in 10m)" in row, row
    assert " ago)" not in row, row
    assert "held, expires in 10m" in status.stdout


# -- exit codes, usage, examples, flags in --help -----------------------------------------------


@pytest.mark.parametrize("command", STORE_COMMANDS, ids=" ".join)
def test_each_commands_help_lists_its_exit_codes(command: tuple[str, ...]) -> None:
    text = CliRunner().invoke(main, [*command, "--help"]).stdout
    assert "Exit codes:" in text
    codes = text.split("Exit codes:")[1].split("Options:")[0]
    listed = {line.split()[0] for line in codes.strip().splitlines()}
    assert {"0", "2", "5"} <= listed


def test_doctor_help_lists_the_usage_code_and_unsafe() -> None:
    text = CliRunner().invoke(main, ["doctor", "--help"]).stdout
    codes = text.split("Exit codes:")[1].split("Options:")[0]
    assert {line.split()[0] for line in codes.strip().splitlines()} >= {"0", "2", "5", "11"}


@pytest.mark.parametrize(
    "command", [("state", "set"), ("state", "import"), ("state", "copy"), ("state", "rollback")]
)
def test_operator_mistakes_code_six_is_in_the_help_of_the_commands_that_return_it(
    command: tuple[str, ...],
) -> None:
    text = CliRunner().invoke(main, [*command, "--help"]).stdout
    assert "  6   bad input" in text


@pytest.mark.usefixtures("clean_environment")
def test_invalid_json_for_state_set_exits_with_the_documented_bad_input_code(
    tmp_path: Path,
) -> None:
    result = cli(tmp_path, "state", "set", "job", "{not json")
    assert result.exit_code == 6
    assert "not valid JSON" in error_line(result)
    codes = (ROOT / "docs" / "exit-codes.md").read_text()
    row = next(line for line in codes.splitlines() if line.startswith("| 6 |"))
    assert "state set" in row
    assert "import" in row
    assert "--force" in row


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_read_only_commands_do_not_offer_lease_flags(command: tuple[str, ...]) -> None:
    text = CliRunner().invoke(main, [*command, "--help"]).stdout
    assert "--state-backend-uri" in text
    assert "--lock-timeout-seconds" in text
    for flag in LEASE_FLAGS:
        assert flag not in text


def test_writes_offer_the_lease_flags() -> None:
    text = CliRunner().invoke(main, ["state", "set", "--help"]).stdout
    for flag in LEASE_FLAGS:
        assert flag in text


def test_the_usage_line_is_two_plain_forms() -> None:
    text = CliRunner().invoke(main, ["--help"]).stdout
    first, second = text.splitlines()[:2]
    assert first == "Usage: mapper-state [OPTIONS]"
    assert second.split() == ["or:", "mapper-state", "COMMAND", "[ARGS]..."]
    assert "|" not in first


@pytest.mark.parametrize(
    "command",
    HELP_WITH_EXAMPLES,
    ids=lambda c: " ".join(c) or "filter",
)
def test_the_main_commands_help_has_examples(command: tuple[str, ...]) -> None:
    text = CliRunner().invoke(main, [*command, "--help"]).stdout
    assert "Example" in text
    examples = text.split("Example")[1]
    assert "mapper-state" in examples


def test_shell_completion_is_documented_and_works() -> None:
    assert "_MAPPER_STATE_COMPLETE=bash_source" in (ROOT / "docs" / "operations.md").read_text()
    result = CliRunner().invoke(
        main, [], env={"_MAPPER_STATE_COMPLETE": "bash_source"}, prog_name="mapper-state"
    )
    assert "_mapper_state_completion" in result.stdout
