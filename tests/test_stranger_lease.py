"""A run fenced by `lock break` names who broke its lease, not itself."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli, spawn_cli, wait_for_lease


def test_a_broken_run_says_an_operator_broke_its_lease(tmp_path: Path) -> None:
    store = tmp_path / ".mapper-state"
    holder = spawn_cli("--state-id", "busy", "--lock-timeout-seconds", "1.5", cwd=tmp_path)
    record = wait_for_lease(store, "busy")
    broke = run_cli("lock", "break", "busy", "--yes", cwd=tmp_path)
    assert broke.returncode == 0, broke.stderr
    assert holder.wait(30) == 4
    assert holder.stderr is not None
    err = holder.stderr.read().decode()
    assert "lost the lease on busy: now broken by an operator (`mapper-state lock break`)" in err
    assert record["run_id"] not in err  # it does not name itself as the breaker
