"""Settings and user errors: one line naming the problem, before anything is read or written.

Most run in-process (:mod:`tests.support.cli`); a missing state ID and an unknown scheme are
checked through a real process too: the exit code and the one line a shell sees.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import clean_env, run_cli, state_line, stored_state
from tests.support.cli import invoke, invoke_filter, one_line_error


def assert_refused(result: subprocess.CompletedProcess[bytes], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    one_line_error(result.stderr, *needles)


@pytest.mark.parametrize(
    ("state_id", "needle"),
    [
        ("../escape", "'..'"),
        ("a/../../b", "'..'"),
        ("/abs", "start or end with '/'"),
        ("a//b", "empty"),
        ("bad\x01id", "control character"),
        ("x" * 600, "longer than"),
        ("", "state_id is required"),
        (".mapper-state-doctor/x", "reserved"),
    ],
)
def test_bad_state_ids_are_refused_before_anything_is_written(
    tmp_path: Path, state_id: str, needle: str
) -> None:
    result = invoke_filter("--state-id", state_id, cwd=tmp_path, input=state_line({"a": 1}))
    assert_refused(result, 2, needle)
    assert result.stdout == b""
    assert not (tmp_path / ".mapper-state").exists()


def test_missing_state_id(tmp_path: Path) -> None:
    result = run_cli(cwd=tmp_path, input=b"")
    assert_refused(result, 2, "state_id is required")


def test_meltano_style_ids_are_valid(tmp_path: Path) -> None:
    result = invoke_filter(
        "--state-id", "dev:tap-a-to-target-b", cwd=tmp_path, input=state_line({"a": 1})
    )
    assert result.returncode == 0
    assert stored_state(tmp_path / ".mapper-state", "dev:tap-a-to-target-b") == {"a": 1}


def test_bad_setting_values_name_the_setting(tmp_path: Path) -> None:
    result = invoke(
        "--state-id", "x", "--set", "state_backend.lock_timeout_seconds=soon", cwd=tmp_path
    )
    assert_refused(result, 2, "state_backend.lock_timeout_seconds", "number")
    env = clean_env(MAPPER_STATE_CHECKPOINT_INTERVAL_SECONDS="-1")
    result = invoke("--state-id", "x", cwd=tmp_path, env=env)
    assert_refused(
        result, 2, "checkpoint_interval_seconds", "MAPPER_STATE_CHECKPOINT_INTERVAL_SECONDS"
    )
    result = invoke("--state-id", "x", "--set", "no_such_setting=1", cwd=tmp_path)
    assert_refused(result, 2, "unknown setting no_such_setting")


def test_unreadable_and_invalid_config_files(tmp_path: Path) -> None:
    assert_refused(
        invoke("--config", "missing.json", cwd=tmp_path), 2, "missing.json", "does not exist"
    )
    (tmp_path / "bad.json").write_text("{nope")
    assert_refused(invoke("--config", "bad.json", cwd=tmp_path), 2, "not valid JSON")
    (tmp_path / "list.json").write_text("[1]")
    assert_refused(invoke("--config", "list.json", cwd=tmp_path), 2, "JSON object")
    (tmp_path / "typo.json").write_text('{"state_backend": {"urii": "file:///x"}}')
    assert_refused(invoke("--config", "typo.json", cwd=tmp_path), 2, "state_backend.urii")
    assert not (tmp_path / ".mapper-state").exists()


def test_relative_file_uris_and_bare_paths(tmp_path: Path) -> None:
    line = state_line({"a": 1})
    for uri, where in (("file:rel-a", "rel-a"), ("file://rel-b", "rel-b"), ("rel-c/x", "rel-c/x")):
        assert (
            invoke_filter(
                "--state-id", "r", "--state-backend-uri", uri, cwd=tmp_path, input=line
            ).returncode
            == 0
        )
        assert stored_state(tmp_path / where, "r") == {"a": 1}, uri
    absolute = tmp_path / "abs"
    invoke_filter(
        "--state-id", "r", "--state-backend-uri", f"file://{absolute}", cwd=tmp_path, input=line
    )
    assert stored_state(absolute, "r") == {"a": 1}


def test_unknown_uri_scheme(tmp_path: Path) -> None:
    result = run_cli("--state-id", "x", "--state-backend-uri", "ftp://host/dir", cwd=tmp_path)
    assert_refused(result, 2, "unknown scheme ftp://")


def test_precedence_flags_over_files_over_env_over_meltano(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"state_backend": {"uri": "file://from-file-a"}}))
    (tmp_path / "b.json").write_text(
        json.dumps({"state_backend.uri": "file://from-file-b", "state_id": "cfg"})
    )
    env = clean_env(
        MAPPER_STATE_STATE_BACKEND__URI="file://from-env",
        MELTANO_STATE_BACKEND_URI="file://from-meltano",
    )
    line = state_line({"a": 1})
    invoke_filter("--state-id", "m", cwd=tmp_path, env=env, input=line)
    assert stored_state(tmp_path / "from-env", "m") == {"a": 1}
    invoke_filter("--config", "a.json", "--config", "b.json", cwd=tmp_path, env=env, input=line)
    assert stored_state(tmp_path / "from-file-b", "cfg") == {"a": 1}
    invoke_filter(
        "--config",
        "b.json",
        "--state-backend-uri",
        "file://from-flag",
        cwd=tmp_path,
        env=env,
        input=line,
    )
    assert stored_state(tmp_path / "from-flag", "cfg") == {"a": 1}
    # Meltano reads only the path of a file:// URI, so its URIs are absolute
    meltano_only = clean_env(MELTANO_STATE_BACKEND_URI=f"file://{tmp_path / 'from-meltano'}")
    invoke_filter("--state-id", "m", cwd=tmp_path, env=meltano_only, input=line)
    assert stored_state(tmp_path / "from-meltano", "m") == {"a": 1}


def test_a_null_in_a_config_file_leaves_the_setting_to_the_other_sources(tmp_path: Path) -> None:
    """JSON's null is "not set here": the environment's value or the default stands, as
    for a flag not given."""
    (tmp_path / "c.json").write_text(
        json.dumps(
            {
                "state_id": "from-file",
                "state_backend": {"uri": None, "lock_timeout_seconds": None},
                "history_keep": None,
                "state_merge": None,
            }
        )
    )
    env = clean_env(MAPPER_STATE_STATE_BACKEND__URI="file://from-env")
    line = state_line({"a": 1})
    result = invoke_filter("--config", "c.json", cwd=tmp_path, env=env, input=line)
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / "from-env", "from-file") == {"a": 1}
    lease = invoke("lock", "status", "from-file", "--config", "c.json", "--format", "json",
                   cwd=tmp_path, env=env)  # fmt: skip
    assert lease.returncode == 0, lease.stderr


SECONDS_SETTINGS = [
    "state_backend.lock_timeout_seconds",
    "state_backend.lock_retry_seconds",
    "state_backend.lock_wait_seconds",
    "checkpoint_interval_seconds",
]


@pytest.mark.parametrize("name", SECONDS_SETTINGS)
def test_a_time_too_long_for_the_clock_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """1e20 seconds was taken, and a lease of that length ended the run with an internal
    error (Python cannot wait that long); now any time over 1e9 s (31 years) is refused before
    anything is stored, and 1e9 s itself runs."""
    env = clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path / 'store'}")
    line = state_line({"a": 1})
    refused = invoke_filter("--state-id", "p", "--set", f"{name}=1e20", env=env, input=line)
    assert_refused(refused, 2, name, "must be at most 1e+09, not 1e+20")
    assert refused.stdout == b""
    assert not (tmp_path / "store").exists()
    taken = invoke_filter("--state-id", "p", "--set", f"{name}=1e9", env=env, input=line)
    assert taken.returncode == 0, taken.stderr
    assert stored_state(tmp_path / "store", "p") == {"a": 1}


def test_config_env_marker_and_env_settings(tmp_path: Path) -> None:
    env = clean_env(MAPPER_STATE_STATE_ID="from-env", MAPPER_STATE_STATE_MERGE="true")
    result = invoke_filter("--config", "ENV", cwd=tmp_path, env=env, input=state_line({"a": 1}))
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / ".mapper-state", "from-env") == {"a": 1}


def test_secrets_never_appear(tmp_path: Path) -> None:
    secret = "sUp3rS3cretValue/abc"
    (tmp_path / "c.json").write_text(
        json.dumps(
            {
                "state_id": "x",
                "state_backend": {
                    "uri": "ftp://user:hunter2pass@host/x",
                    "s3": {"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": secret},
                },
            }
        )
    )
    result = invoke_filter("--config", "c.json", cwd=tmp_path)
    assert result.returncode == 2
    out = result.stdout + result.stderr
    assert secret.encode() not in out
    assert b"hunter2pass" not in out
    about = invoke("--about", "--format", "json", "--config", "c.json", cwd=tmp_path)
    assert secret.encode() not in about.stdout + about.stderr


def test_version_and_about(tmp_path: Path) -> None:
    version = invoke("--version")
    assert version.returncode == 0
    assert version.stdout.startswith(b"mapper-state ")
    about = json.loads(invoke("--about", "--format", "json").stdout)
    assert about["name"] == "mapper-state"
    props = about["settings"]["properties"]
    assert props["state_backend"]["properties"]["uri"]["default"] == "file://.mapper-state"
    assert props["state_backend"]["properties"]["s3"]["properties"]["aws_secret_access_key"][
        "secret"
    ]
    markdown = invoke("--about", "--format", "markdown").stdout.decode()
    assert "state_backend.lock_timeout_seconds" in markdown
    text = invoke("--about").stdout.decode()
    assert "MAPPER_STATE_STATE_BACKEND__URI" in text
