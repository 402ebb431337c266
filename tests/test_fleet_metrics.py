"""Fleet metrics from the store: `mapper-state metrics` and `metrics serve` through the real
command (local store and S3 on moto), the shipped alert rules checked and unit-tested by
promtool, and a real Prometheus scraping `metrics serve` firing the stale and failed alerts
and not the fresh one, read from its own API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, state_line
from tests.support.processes import MAPPER, clean_env, free_port, popen, stop, wait_until
from tests.test_runs import SECRET, arrange_fleet

RULES = Path(__file__).resolve().parent.parent / "examples" / "prometheus"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(name, sorted labels): value}`` of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def by_state(found: dict[Any, float], name: str, **labels: str) -> dict[str, float]:
    return {
        dict(k)["state_id"]: v
        for (n, k), v in found.items()
        if n == name and all(dict(k).get(a) == b for a, b in labels.items())
    }


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: scripts/install-system.sh installs Prometheus"
    return path


@contextmanager
def serving(cli: StoreCli, *args: str) -> Iterator[str]:
    """``metrics serve`` on a free port; its base URL."""
    port = free_port()
    proc = popen(
        [MAPPER, "metrics", "serve", "--listen", f"127.0.0.1:{port}", *args],
        env=clean_env(**cli.env),
        cwd=cli.cwd,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url) or proc.poll() is not None, "metrics serve", 30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        yield url
    finally:
        stop(proc)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5):
            return True
    except OSError:
        return False


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_metrics_expose_every_pipeline(store_cli: StoreCli) -> None:
    cli = store_cli
    arrange_fleet(cli)
    pipelines = ["fleet:busy", "fleet:failed", "fleet:killed", "fleet:ok"]

    def killed_shown() -> dict[str, float]:
        printed = cli("metrics", "--max-age", "fleet:ok=2h", "--max-age", "1d")
        assert printed.returncode == 0, printed.stderr
        return by_state(
            samples(printed.stdout.decode()), "mapper_state_last_run_outcome", outcome="killed"
        )

    wait_until(lambda: killed_shown().get("fleet:killed") == 1, "the killed run shown", 20)
    printed = cli("metrics", "--max-age", "fleet:ok=2h", "--max-age", "1d").stdout.decode()
    assert SECRET not in printed
    found = samples(printed)
    assert found[("mapper_state_fleet_pipelines", ())] == 4
    commits = by_state(found, "mapper_state_last_commit_timestamp_seconds")
    assert sorted(commits) == pipelines
    assert all(abs(t - time.time()) < 300 for t in commits.values())
    assert by_state(found, "mapper_state_max_age_seconds") == {
        "fleet:busy": 86400,
        "fleet:failed": 86400,
        "fleet:killed": 86400,
        "fleet:ok": 7200,
    }
    outcomes = {
        state_id: outcome
        for (name, labels), value in found.items()
        if name == "mapper_state_last_run_outcome" and value == 1
        for state_id, outcome in [(dict(labels)["state_id"], dict(labels)["outcome"])]
    }
    assert outcomes == {
        "fleet:busy": "busy",
        "fleet:failed": "failed",
        "fleet:killed": "killed",
        "fleet:ok": "succeeded",
    }
    assert by_state(found, "mapper_state_last_run_exit_code")["fleet:failed"] == 6
    assert by_state(found, "mapper_state_last_run_records")["fleet:ok"] == 3
    assert set(by_state(found, "mapper_state_lease_held").values()) == {0}

    with serving(cli, "--cache-seconds", "0") as url:
        served = get(url + "/metrics")
        assert SECRET not in served
        assert sorted(by_state(samples(served), "mapper_state_lease_held")) == pipelines
        # a run holding the lease now: held, until when, by which host
        store = cli.open_store()
        from mapper_state.core.lease import Lease

        holder = Lease(store, "fleet:ok", ttl=60, run_id="nightly-7")
        holder.acquire()
        try:
            now = samples(get(url + "/metrics"))
        finally:
            holder.release()
            store.close()
        assert by_state(now, "mapper_state_lease_held")["fleet:ok"] == 1
        assert (
            by_state(now, "mapper_state_lease_expires_timestamp_seconds")["fleet:ok"] > time.time()
        )
        [(labels, _)] = [
            (dict(k), v) for (n, k), v in now.items() if n == "mapper_state_lease_holder_info"
        ]
        assert labels["run_id"] == "nightly-7"
        assert labels["host"]
        request = urllib.request.Request(url + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 405


def test_serve_answers_quick_scrapes_from_its_cache(store_cli: StoreCli) -> None:
    cli = store_cli
    assert cli("--state-id", "cached", input=state_line({"n": 1})).returncode == 0
    with serving(cli, "--cache-seconds", "300") as url:
        first = get(url + "/metrics")
        assert cli("--state-id", "later", input=state_line({"n": 1})).returncode == 0
        assert get(url + "/metrics") == first  # within the cache's age: the same look
    with serving(cli, "--cache-seconds", "0") as url:
        assert "later" in json.dumps(
            sorted(by_state(samples(get(url + "/metrics")), "mapper_state_lease_held"))
        )


def test_bad_serve_options_are_one_line_errors(store_cli: StoreCli) -> None:
    cli = store_cli
    for args in (("--listen", "nowhere"), ("--max-age", "soon")):
        result = cli("metrics", "serve", *args)
        assert result.returncode == 2
        assert result.stderr.decode().count("\n") == 1, result.stderr


def test_the_shipped_rules_pass_promtool() -> None:
    promtool = tool("promtool")
    for args in (
        ["check", "rules", "mapper-state-rules.yml"],
        ["test", "rules", "mapper-state-rules.test.yml"],
    ):
        result = subprocess.run([promtool, *args], cwd=RULES, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert b"SUCCESS" in result.stdout


@pytest.mark.e2e
def test_a_real_prometheus_fires_the_stale_and_failed_alerts(
    store_cli: StoreCli, tmp_path: Path
) -> None:
    cli = store_cli
    for state_id in ("fleet:fresh", "fleet:stale", "fleet:failed"):
        assert cli("--state-id", state_id, input=state_line({"n": 1})).returncode == 0
    two_days_ago = time.time() - 2 * 86400
    os.utime(tmp_path / "store" / "fleet:stale" / "state.json", (two_days_ago, two_days_ago))
    failed = cli("--state-id", "fleet:failed", "--strict", input=b'{"type":"STATE","value":\n')
    assert failed.returncode == 6

    with serving(cli, "--max-age", "36h", "--cache-seconds", "1") as url:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {RULES / 'mapper-state-rules.yml'}\n"
            "scrape_configs:\n  - job_name: mapper-state\n"
            f"    static_configs:\n      - targets: ['{url.removeprefix('http://')}']\n"
        )
        prometheus = popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        api = f"http://127.0.0.1:{port}/api/v1/alerts"
        try:

            def firing() -> set[tuple[str, str]]:
                try:
                    alerts = json.loads(get(api))["data"]["alerts"]
                except OSError:
                    return set()
                return {
                    (a["labels"]["alertname"], a["labels"]["state_id"])
                    for a in alerts
                    if a["state"] == "firing"
                }

            wanted = {
                ("MapperStatePipelineStale", "fleet:stale"),
                ("MapperStateLastRunFailed", "fleet:failed"),
            }
            wait_until(lambda: wanted <= firing(), "the stale and failed alerts firing", 45)
            time.sleep(2)  # a few more evaluations: the fresh one must still not fire
            fired = firing()
        finally:
            stop(prometheus)
    assert wanted <= fired
    assert not [a for a in fired if a[1] == "fleet:fresh"]
    assert fired == wanted
