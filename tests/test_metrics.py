"""`--metrics-file`: Prometheus text for node_exporter's textfile collector, written at each
commit and at exit by the filter and `run`, read back with prometheus_client's own parser."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mapper_state.core.lease import Lease
from mapper_state.stores.file import FileStore
from tests.conftest import ON_BOTH
from tests.helpers import (
    MAPPER,
    StoreCli,
    clean_env,
    record_line,
    state_line,
    tiny_run,
    wait_until,
)


def samples(path: Path) -> dict[str, tuple[dict[str, str], float]]:
    """``{sample name: (labels, value)}`` as Prometheus would read the file."""
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            found[sample.name] = (sample.labels, sample.value)
    return found


def values(path: Path) -> dict[str, float]:
    return {name: value for name, (_, value) in samples(path).items()}


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_the_filter_writes_its_metrics(store_cli: StoreCli, tmp_path: Path) -> None:
    cli = store_cli
    metrics = tmp_path / "textfile" / "mapper_state.prom"
    metrics.parent.mkdir()
    stream = b"".join(record_line(i) for i in range(5)) + state_line({"bookmarks": {"s": 5}})
    started = time.time()
    result = cli("--state-id", "dev:job", "--metrics-file", str(metrics), input=stream)
    assert result.returncode == 0, result.stderr
    found = samples(metrics)
    assert {labels["state_id"] for labels, _ in found.values()} == {"dev:job"}
    got = values(metrics)
    assert got["mapper_state_records_total"] == 5
    assert got["mapper_state_bytes_total"] == len(stream)
    assert got["mapper_state_states_total"] == 1
    assert got["mapper_state_commits_total"] == 1
    assert got["mapper_state_commits_refused_total"] == 0
    assert started <= got["mapper_state_last_commit_timestamp_seconds"] <= time.time()
    assert 0 <= got["mapper_state_lease_wait_seconds"] < 10
    assert 0 < got["mapper_state_run_duration_seconds"] < 60
    assert got["mapper_state_running"] == 0
    assert got["mapper_state_exit_code"] == 0
    assert [p.name for p in metrics.parent.iterdir()] == [metrics.name]  # no temp file left


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_run_writes_its_metrics(store_cli: StoreCli, tmp_path: Path) -> None:
    cli = store_cli
    metrics = tmp_path / "run.prom"
    result = cli(
        *tiny_run(tmp_path, "--metrics-file", str(metrics)), TINY_TARGET_EMPTY_STATE_AT_END="1"
    )
    assert result.returncode == 0, result.stderr
    got = values(metrics)
    assert got["mapper_state_records_total"] == 3
    assert got["mapper_state_states_total"] == 4  # the target confirmed 3, then printed {}
    assert got["mapper_state_commits_total"] >= 1
    assert got["mapper_state_commits_refused_total"] == 1  # the guard refused the {}
    assert got["mapper_state_bytes_total"] > 0
    assert got["mapper_state_exit_code"] == 0


def test_metrics_are_written_at_each_commit_while_running(tmp_path: Path) -> None:
    metrics = tmp_path / "live.prom"
    proc = subprocess.Popen(
        [
            *(MAPPER, "--state-id", "live", "--checkpoint-interval-seconds", "0"),
            *("--metrics-file", str(metrics), "--state-backend-uri", f"file://{tmp_path}/s"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    assert proc.stdin is not None
    try:
        for n in (1, 2):
            proc.stdin.write(state_line({"bookmarks": {"s": n}}))
            proc.stdin.flush()

            def committed(n: int = n) -> bool:
                return metrics.exists() and values(metrics).get("mapper_state_commits_total") == n

            wait_until(committed, f"commit {n} in the metrics file")
            assert values(metrics)["mapper_state_running"] == 1
            assert "mapper_state_exit_code" not in values(metrics)
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert proc.returncode == 0
    assert values(metrics)["mapper_state_exit_code"] == 0


def test_a_busy_lease_is_in_the_metrics_too(tmp_path: Path) -> None:
    store = tmp_path / "s"
    holder = Lease(FileStore(store), "busy", ttl=30)
    holder.acquire()
    metrics = tmp_path / "busy.prom"
    try:
        result = subprocess.run(
            [
                *(MAPPER, "--state-id", "busy", "--metrics-file", str(metrics)),
                *("--state-backend-uri", f"file://{store}"),
                *("--lock-wait-seconds", "0.5", "--lock-retry-seconds", "0.1"),
            ],
            input=b"",
            capture_output=True,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    finally:
        holder.release()
    assert result.returncode == 3, result.stderr
    got = values(metrics)
    assert got["mapper_state_exit_code"] == 3
    assert got["mapper_state_lease_wait_seconds"] >= 0.3  # it waited, then gave up
    assert got["mapper_state_commits_total"] == 0


def test_a_metrics_file_in_a_missing_folder_is_a_config_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [MAPPER, "--state-id", "x", "--metrics-file", str(tmp_path / "no" / "m.prom")],
        input=b"",
        capture_output=True,
        env=clean_env(MAPPER_STATE_STATE_BACKEND__URI=f"file://{tmp_path}/s"),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert b"setting metrics_file: the folder" in result.stderr
    assert not (tmp_path / "s").exists()  # nothing was read or written


def test_start_up_does_not_import_the_metrics_library() -> None:
    code = (
        "import sys\n"
        "from mapper_state.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('prometheus'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        capture_output=True,
        env=clean_env(),
        check=True,
    )
    assert json.loads(result.stdout.decode().splitlines()[-1]) == []
