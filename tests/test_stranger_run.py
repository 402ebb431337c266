"""What `run` stores and says when the target is not a well-behaved Singer target."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    clean_env,
    run_cli,
    spawn_cli,
    stored_state,
    tiny_run,
    tiny_tap_run,
    tiny_target,
    wait_until,
)


def run(tmp_path: Path, target: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return run_cli(
        *tiny_tap_run(target),
        cwd=tmp_path,
        env=clean_env(TINY_TAP_REPORT=str(tmp_path / "tap.json"), **env),
    )


def test_a_target_echoing_its_input_stores_the_state_values_not_the_messages(
    tmp_path: Path,
) -> None:
    first = run(tmp_path, "cat")
    assert first.returncode == 0, first.stderr
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 3}}
    err = first.stderr.decode()
    # the echoed SCHEMA and RECORD lines are not states: said once each, not per line
    assert err.count("printed a Singer RECORD message, not a state; not stored") == 1
    assert err.count("printed a Singer SCHEMA message, not a state; not stored") == 1
    assert "states_confirmed=3" in err
    # and the next run's tap gets the bare state, not a STATE message
    second = run(tmp_path, "cat")
    assert second.returncode == 0, second.stderr
    report = json.loads((tmp_path / "tap.json").read_text())
    assert report["state"] == {"bookmarks": {"s": 3}}
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 6}}


def test_lines_from_the_target_that_are_not_objects_are_not_stored(tmp_path: Path) -> None:
    script = tmp_path / "target.sh"
    script.write_text("cat >/dev/null\necho 42\necho '[\"a\"]'\necho not-json\n")
    result = run(tmp_path, f"sh {script}")
    assert result.returncode == 0, result.stderr
    assert stored_state(tmp_path / ".mapper-state", "job") is None
    err = result.stderr.decode()
    assert err.count("a line from the target is not a JSON object; passed through") == 1
    assert "is not a JSON state; passed through, not stored" in err
    assert "states_confirmed=0" in err


def test_a_failing_target_that_confirmed_nothing_does_not_claim_a_store(tmp_path: Path) -> None:
    result = run(tmp_path, "sh -c 'cat >/dev/null; exit 1'")
    assert result.returncode == 8, result.stderr
    err = result.stderr.decode()
    assert "stored the last state" not in err
    assert "the target failed (exit 1); it confirmed none: the stored state is unchanged" in err


def test_a_failing_target_that_confirmed_states_says_it_stored_the_last(tmp_path: Path) -> None:
    result = run(tmp_path, f"sh -c '{tiny_target(tmp_path / 'out.jsonl')}; exit 1'")
    assert result.returncode == 8, result.stderr
    assert b"the target failed (exit 1); stored the last state it confirmed" in result.stderr
    assert stored_state(tmp_path / ".mapper-state", "job") == {"bookmarks": {"s": 3}}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_says_so_with_signal_names(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "out.jsonl"
    proc = spawn_cli(
        *tiny_run(tmp_path),
        cwd=tmp_path,
        env=clean_env(TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.05"),
    )
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 3, "records")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    text = err.decode()
    assert f"interrupted by {sig.name}; stored the last state the target confirmed" in text
    assert f"tap_exit={sig.name}" in text
    assert "=-" not in text  # no raw negative exit codes
