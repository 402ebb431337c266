"""Mutual exclusion: many processes race for one lease, round after round, on every store.

Each holder (``tests/chaos/holder.py``) writes down when it held the lease; the test
merges the logs and checks that no two intervals overlap, that every round completed,
and that a counter every holder increments in the state (read, then a fenced write)
ends at exactly the number of rounds: no lost update. With faults, a fault proxy sits
between the SDK and the emulator (errors, throttling, resets, lost responses of applied
requests, slow answers) and some holders "crash" holding the lease (no renewal, no
release), which the others must take over once it has expired. A holder whose renewals
the store does not answer in time gives its lease up (``lapsed``): safe, and rare; one
that finds its live lease taken (``lost``) fails the test.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mapper_state.core import state
from tests.chaos import cli
from tests.chaos.conftest import (
    CLOUD,
    STORES,
    ChaosBudget,
    file_location,
    location_for,
    record_figures,
)
from tests.chaos.intervals import describe, overlaps, read_logs
from tests.helpers import clean_env
from tests.servers import StoreLocation

ROOT = Path(__file__).resolve().parents[2]
TTL = 3.0
#: Faults on the wire, as rates of the requests: about one request in six is hit.
WIRE_FAULTS: dict[str, Any] = {
    "error": 0.03,
    "throttle": 0.02,
    "reset": 0.03,
    "drop_response": 0.03,
    "error_applied": 0.02,
    "delay": 0.03,
    "delay_seconds": 0.2,
    "error_statuses": [500, 503],
}
ABANDON_RATE = 0.02


def a_location(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> StoreLocation:
    return file_location(tmp_path / "store") if kind == "file" else location_for(request, kind)


def spec_for(location: StoreLocation, state_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "uri": location.uri,
        "section": location.emulator.section,
        "options": location.options,
        "env": location.env,
        "state_id": state_id,
        **extra,
    }


def _die_with_parent() -> None:
    """In a holder: get SIGKILL if the test process dies, so no holder outlives its test."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_holders(
    tmp_path: Path, specs: list[dict[str, Any]], timeout: float
) -> tuple[list[Path], list[subprocess.Popen[bytes]]]:
    """Start one holder process per spec; wait for all; return their logs and processes."""
    logs, procs = [], []
    for i, spec in enumerate(specs):
        spec_path = tmp_path / f"holder-{i}.json"
        spec_path.write_text(json.dumps({**spec, "log": i}))
        log = tmp_path / f"holder-{i}.jsonl"
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.holder", str(spec_path), str(log)],
                cwd=ROOT,
                env=clean_env(PYTHONPATH=str(ROOT)),
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / f"holder-{i}.stderr", "wb"),  # noqa: SIM115
                preexec_fn=_die_with_parent,
            )
        )
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return logs, procs


def holder_failures(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    bad = [
        f"holder {i} exited {p.returncode}:\n"
        + (tmp_path / f"holder-{i}.stderr").read_text(errors="replace")[-2000:]
        for i, p in enumerate(procs)
        if p.returncode != 0
    ]
    return "\n".join(bad)


@pytest.mark.parametrize("faults", ["none", "faults"])
@pytest.mark.parametrize("kind", STORES)
def test_holders_never_overlap(
    request: pytest.FixtureRequest,
    start_proxy: Any,
    chaos_budget: ChaosBudget,
    tmp_path: Path,
    kind: str,
    faults: str,
) -> None:
    if kind in CLOUD:
        request.applymarker(pytest.mark.cloud)
    location = a_location(request, kind, tmp_path)
    direct = location.open()
    proxy = None
    reached = location
    if faults == "faults" and kind in CLOUD:
        wire = dict(WIRE_FAULTS)
        if kind == "gcs":
            wire["throttle_status"] = 429
        proxy, reached = start_proxy(location, seed=20240601, faults=wire)
    state_id = f"chaos:exclusion-{uuid.uuid4().hex[:8]}"
    n, rounds = chaos_budget.processes, chaos_budget.rounds
    specs = [
        spec_for(
            reached,
            state_id,
            ttl=TTL,
            retry=0.05 if kind == "file" else 0.1,
            rounds=rounds,
            hold_ms=10,
            seed=1000 + i,
            abandon_rate=ABANDON_RATE if faults == "faults" else 0.0,
        )
        for i in range(n)
    ]
    started = time.monotonic()
    logs, procs = run_holders(tmp_path, specs, timeout=120 + n * rounds * 1.0)
    elapsed = time.monotonic() - started
    assert not holder_failures(tmp_path, procs), holder_failures(tmp_path, procs)

    held = read_logs(logs)
    by_kind: dict[str, int] = {}
    for h in held:
        by_kind[h.kind] = by_kind.get(h.kind, 0) + 1
    pairs = overlaps(held)
    counted = sum(1 for h in held if h.raw.get("counted"))
    conflicts = sum(1 for h in held if h.raw.get("conflict"))
    final = state.load(direct, state_id).value
    injected = cli.injected_faults(proxy) if proxy is not None else {}
    record_figures(
        "mutual exclusion (Lease class)",
        kind,
        processes=n,
        rounds=rounds,
        acquisitions=len(held),
        kinds=by_kind,
        faults=faults,
        injected=injected,
        store_errors_met=sum(h.errors for h in held),
        overlaps=len(pairs),
        lost_updates=counted - int((final or {}).get("n", 0)),
        seconds=round(elapsed, 1),
    )
    assert len(held) == n * rounds, f"{len(held)} of {n * rounds} rounds completed"
    assert not pairs, f"{len(pairs)} overlapping holds:\n{describe(pairs)}"
    lost = [h.raw for h in held if h.kind == "lost"]
    assert not lost, f"a holder found its live lease taken: {lost}"
    # a holder whose renewals the store did not answer in time gives its lease up (safe);
    # more than the odd round means the heartbeat, not the store, is losing leases
    lapsed = [h.raw for h in held if h.kind == "lapsed"]
    assert len(lapsed) <= max(1, len(held) // 20), f"leases given up unrenewed: {lapsed}"
    assert conflicts == 0, "a fenced state write found the state changed behind a holder"
    assert final == {"n": counted}, f"the counter says {final}, {counted} increments were made"
    if faults == "faults":
        # some holder walked away, where enough rounds were run to expect it (5 or more)
        assert by_kind.get("abandoned", 0) > 0 or rounds * n * ABANDON_RATE < 5
        if proxy is not None:
            assert sum(injected.values()) > 0


@pytest.mark.parametrize("kind", STORES)
def test_cli_runs_never_overlap(
    request: pytest.FixtureRequest, chaos_budget: ChaosBudget, tmp_path: Path, kind: str
) -> None:
    """The real ``mapper-state run`` as the holder: its tap stamps its start, its target the
    end of its input, both inside the time the command held the lease."""
    if kind in CLOUD:
        request.applymarker(pytest.mark.cloud)
    location = a_location(request, kind, tmp_path)
    state_id = f"chaos:cli-exclusion-{uuid.uuid4().hex[:8]}"
    n, rounds = chaos_budget.processes, chaos_budget.cli_rounds
    specs = [
        spec_for(location, state_id, cli=True, ttl=10, retry=0.1, rounds=rounds) for _ in range(n)
    ]
    started = time.monotonic()
    logs, procs = run_holders(tmp_path, specs, timeout=120 + n * rounds * 10.0)
    elapsed = time.monotonic() - started
    assert not holder_failures(tmp_path, procs), holder_failures(tmp_path, procs)
    held = read_logs(logs)
    failed = [h.raw for h in held if h.kind != "held"]
    pairs = overlaps(held)
    final = state.load(location.open(), state_id).value
    record_figures(
        "mutual exclusion (mapper-state run)",
        kind,
        processes=n,
        rounds=rounds,
        runs=len(held),
        failed_runs=len(failed),
        overlaps=len(pairs),
        lost_updates=len(held) - int((final or {}).get("n", 0)),
        seconds=round(elapsed, 1),
    )
    assert not failed, f"runs failed: {failed[:3]}"
    assert len(held) == n * rounds
    assert not pairs, f"{len(pairs)} overlapping runs:\n{describe(pairs)}"
    # each run handed its tap the prior state and stored prior + 1: no update was lost
    assert final == {"n": n * rounds}
