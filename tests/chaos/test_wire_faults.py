"""Runs through a faulty network: the right state or a clean failure, never a wrong one.

A fault proxy (mitmproxy with ``tests/proxy/faults.py``) sits between the store's SDK
and its emulator (moto, Azurite, fake-gcs-server) and answers 500/503 or throttling,
resets connections, delays answers, and applies requests whose answer it then drops.
Every run either ends 0 with every input byte passed through and the last state
stored, or fails cleanly (exit 5) with its lease released and a stored state that is
one the stream carried (or the prior one); never exit 4, since nobody else competes:
a conditional write retried after its first answer was lost is not a lost lease.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import cli
from tests.chaos.conftest import CLOUD, EXIT_MARGIN, ChaosBudget, record_figures
from tests.e2e.conftest import children_of, is_gone
from tests.helpers import TINY_TAP, state_line, tiny_target, wait_until
from tests.servers import StoreLocation
from tests.support.cli import one_line_error

pytestmark = pytest.mark.cloud

#: About one request in four is hit by some fault.
RUN_FAULTS: dict[str, Any] = {
    "error": 0.05,
    "throttle": 0.03,
    "reset": 0.04,
    "drop_response": 0.05,
    "error_applied": 0.03,
    "delay": 0.03,
    "delay_request": 0.02,
    "delay_seconds": 0.3,
}
HOSTILE = ["plain", "ünïcødé ☃", 'quote " and \\ backslash', "STATE", "\u2028line sep"]


def lease_writes(kind: str, state_id: str) -> dict[str, Any]:
    """Control-file keys that select the writes of the lease object on ``kind``'s wire."""
    if kind == "gcs":  # an upload names its object in its body
        return {"match": "/upload/", "body_match": cli.LEASE_FILE}
    return {"match": f"{state_id}/{cli.LEASE_FILE}", "methods": ["PUT"]}


def state_writes(kind: str, state_id: str) -> dict[str, Any]:
    if kind == "gcs":
        return {"match": "/upload/", "body_match": "state.json"}
    return {"match": f"{state_id}/state.json", "methods": ["PUT"]}


def all_writes(kind: str, state_id: str) -> dict[str, Any]:
    """Every write under the state ID: lease, state and history."""
    if kind == "gcs":
        return {"match": "/upload/", "body_match": f"{state_id}/"}
    return {"match": f"{state_id}/", "methods": ["PUT"]}


def stream(rng: random.Random, run: int) -> tuple[bytes, list[Any]]:
    """Records and STATE messages with awkward values; the states in order."""
    lines, states = [], []
    lines.append(json.dumps({"type": "SCHEMA", "stream": "s", "schema": {}, "key_properties": []}))
    for i in range(rng.randint(50, 400)):
        lines.append(
            json.dumps(
                {"type": "RECORD", "stream": "s", "record": {"i": i, "t": rng.choice(HOSTILE)}}
            )
        )
        if rng.random() < 0.05:
            value = {"bookmarks": {"s": {"run": run, "i": i, "note": rng.choice(HOSTILE)}}}
            states.append(value)
            lines.append(json.dumps({"type": "STATE", "value": value}, ensure_ascii=False))
    value = {"bookmarks": {"s": {"run": run, "i": "end"}}}
    states.append(value)
    lines.append(json.dumps({"type": "STATE", "value": value}))
    return ("\n".join(lines) + "\n").encode(), states


@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_runs_through_faults_end_right_or_fail_cleanly(
    cloud_location: StoreLocation, start_proxy: Any, chaos_budget: ChaosBudget
) -> None:
    kind = cloud_location.emulator.section
    faults = dict(RUN_FAULTS, throttle_status=429 if kind == "gcs" else 503)
    proxy, faulty = start_proxy(cloud_location, seed=7, faults=faults)
    direct = cloud_location.open()
    state_id = f"chaos:wire-{uuid.uuid4().hex[:8]}"
    rng = random.Random(11)
    outcomes: dict[int, int] = {}
    previous: Any = None
    for run in range(chaos_budget.fault_runs):
        data, states = stream(rng, run)
        proc = cli.run(
            faulty, "--state-id", state_id, "--checkpoint-interval-seconds", "0",
            "--lock-timeout-seconds", "15", input=data, timeout=180,
        )  # fmt: skip
        code = proc.returncode
        outcomes[code] = outcomes.get(code, 0) + 1
        err = proc.stderr.decode(errors="replace")
        assert "Traceback" not in err, err
        assert code in (0, 5), f"run {run}: exit {code}: {err}"
        now = cli.stored(direct, state_id)
        if code == 0:
            assert proc.stdout == data, f"run {run}: the stream was altered"
            assert now == states[-1], f"run {run}: stored {now}, the last state was {states[-1]}"
        else:
            assert data.startswith(proc.stdout), f"run {run}: output is not a prefix of the input"
            assert now == previous or now in states, f"run {run}: stored a state never sent: {now}"
        assert cli.lease_is_free(cloud_location, state_id), f"run {run}: lease left behind: {err}"
        previous = now
    injected = cli.injected_faults(proxy)
    record_figures(
        "filter runs through a faulty proxy",
        kind,
        runs=chaos_budget.fault_runs,
        outcomes={str(k): v for k, v in outcomes.items()},
        requests=len(proxy.requests()),
        injected=injected,
        wrong_states=0,
        bytes_lost=0,
    )
    assert sum(injected.values()) > 0
    assert outcomes.get(0, 0) >= chaos_budget.fault_runs // 2, outcomes


@pytest.mark.parametrize("fault", ["drop_response", "error_applied"])
@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_a_lost_answer_to_a_conditional_write_is_not_a_lost_lease(
    cloud_location: StoreLocation, start_proxy: Any, fault: str
) -> None:
    """The server applies a renewal (or a state write) but its answer never arrives; the
    retry then meets its own write as a conflict. That is not someone else's lease."""
    kind = cloud_location.emulator.section
    proxy, faulty = start_proxy(cloud_location)
    direct = cloud_location.open()
    state_id = f"chaos-lost-answer-{uuid.uuid4().hex[:8]}"
    with cli.holding_filter(faulty, direct, state_id, "3") as holder:
        proxy.set_faults(**{fault: 1.0, "max_faults": 2, **lease_writes(kind, state_id)})
        time.sleep(2.5)  # two renewals, every TTL/3, both answered by nothing or an error
        proxy.set_faults(**{fault: 1.0, "max_faults": 1, **state_writes(kind, state_id)})
        line = state_line({"after": fault})
        out, err = holder.communicate(line, timeout=60)
    assert holder.returncode == 0, err.decode(errors="replace")
    assert out == line
    assert cli.stored(direct, state_id) == {"after": fault}
    assert proxy.count(fault=fault) == 3, [r for r in proxy.requests() if r["fault"]]
    assert cli.lease_is_free(cloud_location, state_id)


# -- deadlines ---------------------------------------------------------------------------


@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_state_get_gives_up_on_a_black_hole_within_a_third_of_the_ttl(
    cloud_location: StoreLocation, start_proxy: Any
) -> None:
    """No answer at all: with lock_timeout_seconds=9 the store's deadline is 3 s, and every
    call (retries, connect and read timeouts included) must keep it: timed from the first
    request's arrival at the proxy to the process's exit."""
    proxy, faulty = start_proxy(cloud_location, faults={"blackhole": 1.0, "blackhole_seconds": 120})
    try:
        proc = cli.run(
            faulty, "state", "get", "chaos-blackhole", "--lock-timeout-seconds", "9", timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("state get was still waiting on a black hole after 20 s (deadline 3 s)")
    ended = time.time()
    assert proc.returncode == 5, proc.stderr
    one_line_error(proc.stderr)
    held = [r["time"] for r in proxy.requests() if r["fault"] == "blackhole"]
    assert held, "no request of state get reached the proxy"
    took = ended - min(held)
    assert took < 3 + EXIT_MARGIN, (
        f"state get ended {took:.1f}s after its first request met the black hole "
        f"(deadline 3 s, exit margin {EXIT_MARGIN} s)"
    )


def test_a_hung_state_write_under_a_lease_is_cut_at_a_third_of_the_ttl(
    s3_location: StoreLocation, start_proxy: Any
) -> None:
    """``state set`` under a lease of 9 s whose write of the state is never answered: the
    store was opened with a third of the TTL (3 s) as its limit per call, so the write is
    given up while the lease it was made under still holds, and the command fails with a
    store error. A store left with its own limit (30 s) would keep the hung write, and the
    command, alive long past that lease's expiry."""
    proxy, faulty = start_proxy(s3_location)
    direct = s3_location.open()
    state_id = f"chaos-hung-write-{uuid.uuid4().hex[:8]}"
    proxy.set_faults(blackhole=1.0, blackhole_seconds=120, **state_writes("s3", state_id))
    setter = cli.spawn(
        faulty, "state", "set", state_id, '{"x": 1}', "--lock-timeout-seconds", "9", stdin=None
    )
    with cli.reaped(setter):
        wait_until(lambda: proxy.count(fault="blackhole"), "the state write to hang", timeout=30)
        last = cli.lease_record(direct, state_id)  # the lease the hung write was made under
        assert last is not None
        assert last["pid"] == setter.pid
        code, err = stopped_before_expiry(setter, last)  # not cut at TTL/3: fails here
    assert code == 5, err
    one_line_error(err.encode())
    assert cli.stored(direct, state_id) is None


def _hang_renewals(
    kind: str, state_id: str, proxy: Any, direct: Any, holder: Any
) -> dict[str, Any]:
    """Black-hole every renewal of the lease from now on; the last record that reached the store.

    On an S3-compatible endpoint the acquire ends with a second create-if-absent (the proof
    that the endpoint enforces it), which may still be on its way: only the compare-and-swap
    writes (``If-Match``) are renewals there.
    """
    renewals = {"headers": ["If-Match"]} if kind in ("s3", "rgw") else {}
    proxy.set_faults(
        blackhole=1.0, blackhole_seconds=120, **lease_writes(kind, state_id), **renewals
    )
    time.sleep(0.5)  # a renewal already past the proxy lands; later ones hang
    record = cli.lease_record(direct, state_id)
    assert record is not None
    assert record["pid"] == holder.pid
    return record


#: The TTL of the holders whose renewals hang. The heartbeat gives the lease up at its
#: expiry minus the skew allowance (2 s at 10 s), then reads the lease back (here it
#: answers at once; up to a quarter of the time left when it does not) before it exits; at 6 s
#: the allowance was 1.2 s, and a run under the whole suite once exited 0.2 s past it.
HANG_TTL = "10"


def stopped_before_expiry(holder: subprocess.Popen[bytes], last: dict[str, Any]) -> tuple[int, str]:
    """The holder's exit code and stderr, once it has stopped; fail if it stopped after the
    lease ``last`` expired (or is still running well after)."""
    grace = last["expires_at"] + 10 - time.time()
    try:
        code = holder.wait(timeout=max(1.0, grace))
    except subprocess.TimeoutExpired:
        pytest.fail("the holder was still running 10 s after its lease expired", pytrace=False)
    ended = time.time()
    assert holder.stderr is not None
    err = holder.stderr.read().decode(errors="replace")
    assert ended < last["expires_at"], (
        f"stopped {ended - last['expires_at']:.1f}s after its lease expired"
    )
    return code, err


@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_a_filter_whose_renewals_hang_stops_before_its_lease_expires(
    cloud_location: StoreLocation, start_proxy: Any
) -> None:
    kind = cloud_location.emulator.section
    proxy, faulty = start_proxy(cloud_location)
    direct = cloud_location.open()
    state_id = f"chaos-hung-{uuid.uuid4().hex[:8]}"
    with cli.holding_filter(faulty, direct, state_id, HANG_TTL) as holder:
        last = _hang_renewals(kind, state_id, proxy, direct, holder)
        assert holder.stdin is not None
        holder.stdin.write(state_line({"x": 1}))
        holder.stdin.flush()
        code, err = stopped_before_expiry(holder, last)
    assert code == 4, err
    assert "Traceback" not in err, err
    assert cli.stored(direct, state_id) is None, "a holder that could not renew wrote the state"


def test_a_filter_whose_store_stops_answering_stops_before_its_lease_expires(
    s3_location: StoreLocation, start_proxy: Any
) -> None:
    """Renewals and reads of the lease all hang, at a TTL of 20 s: the heartbeat gives the
    lease up 2 s before its expiry, then reads it back for a renewal that may have landed
    unseen. That read-back once took ``check_seconds`` (2 s at this TTL) and kept the
    process up past its lease; it now takes a quarter of the time left before the expiry
    it knows (half was once 0.2 s too long for a run under the whole suite)."""
    proxy, faulty = start_proxy(s3_location)
    direct = s3_location.open()
    state_id = f"chaos-mute-{uuid.uuid4().hex[:8]}"
    with cli.holding_filter(faulty, direct, state_id, "20") as holder:
        # the acquire ends with a second create-if-absent (the endpoint's proof that it
        # enforces it): once answered, the holder is past its acquire
        lease_path = f"{state_id}/{cli.LEASE_FILE}"
        wait_until(lambda: proxy.count("PUT", lease_path) >= 2, "the acquire to end", timeout=30)
        # every request about the lease from now on, reads too, is held and never answered
        proxy.set_faults(blackhole=1.0, blackhole_seconds=120, match=lease_path)
        time.sleep(0.5)  # a renewal already past the proxy lands; later ones hang
        last = cli.lease_record(direct, state_id)
        assert last is not None
        assert last["pid"] == holder.pid
        code, err = stopped_before_expiry(holder, last)
    assert code == 4, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_a_run_whose_renewals_hang_stops_its_children_before_the_lease_expires(
    cloud_location: StoreLocation, start_proxy: Any, tmp_path: Path
) -> None:
    kind = cloud_location.emulator.section
    proxy, faulty = start_proxy(cloud_location)
    direct = cloud_location.open()
    state_id = f"chaos-hung-run-{uuid.uuid4().hex[:8]}"
    tap, target = TINY_TAP, tiny_target(tmp_path / "out.jsonl")
    env = cli.env_for(faulty, TINY_TAP_COUNT="1000", TINY_TAP_SLEEP="0.1")
    holder = cli.spawn(
        faulty, "run", "--state-id", state_id, "--tap", tap, "--target", target,
        "--lock-timeout-seconds", HANG_TTL, "--checkpoint-interval-seconds", "0", env=env,
        stdin=None, stdout=None,
    )  # fmt: skip
    with cli.reaped(holder):
        cli.wait_for_holder(direct, state_id, holder.pid)
        wait_until(lambda: len(children_of(holder.pid)) == 2, "the tap and target to start")
        children = list(children_of(holder.pid))
        last = _hang_renewals(kind, state_id, proxy, direct, holder)
        code, err = stopped_before_expiry(holder, last)
    assert code == 4, err[-3000:]
    wait_until(lambda: all(is_gone(pid) for pid in children), "the children to stop", timeout=5)
