"""Expiry and fencing: frozen holders, takeovers, writes still in flight, skewed clocks.

* A holder SIGSTOPped past its TTL, a takeover, SIGCONT: the old holder is fenced (exit 4,
  nothing written), the new holder keeps its lease (a third run is refused) and its
  state stands, on every store (fake-gcs-server ignores conditional deletes, so a release
  that trusts them deletes the new holder's lease there).
* A state write still in flight when the lease is taken over must not land.
* Clocks off by plus or minus TTL/2 (the ``Lease`` class's injected clock, in separate
  processes): a skewed contender never takes a live lease, and a crashed holder's lease
  is taken over within TTL + skew + the documented allowance, never held forever.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from mapper_state.core.lease import skew_allowance
from tests.chaos import cli
from tests.chaos.conftest import (
    BUDGET,
    CLOUD,
    a_location,
    record_figures,
    store_of,
)
from tests.chaos.intervals import overlaps, read_logs
from tests.chaos.test_mutual_exclusion import holder_failures, run_holders, spec_for
from tests.chaos.test_wire_faults import all_writes, state_writes
from tests.helpers import record_line, state_line, wait_until
from tests.servers import StoreLocation


def test_a_frozen_holder_is_fenced_and_the_new_holder_keeps_its_lease(
    each_store: StoreLocation,
) -> None:
    location = each_store
    direct = location.open()
    state_id = f"chaos:frozen-{uuid.uuid4().hex[:8]}"
    ttl = 2.0
    taker_args = ("--state-id", state_id, "--lock-timeout-seconds", "30")
    holder = cli.spawn_filter(location, state_id, str(ttl))
    taker = None
    try:
        first = cli.wait_for_holder(direct, state_id, holder.pid)
        # frozen once streaming: frozen in its first read of the state, it would fail that
        # read past its deadline (exit 5) instead of being fenced
        assert holder.stdin is not None
        assert holder.stdout is not None
        holder.stdin.write(record_line(1))
        holder.stdin.flush()
        assert holder.stdout.readline() == record_line(1)
        holder.send_signal(signal.SIGSTOP)
        time.sleep(ttl + skew_allowance(ttl) + 0.3)
        # the new holder renews only every 10 s, so a deleted lease shows at once
        taker = cli.spawn(location, *taker_args, "--lock-wait-seconds", "30")
        cli.wait_for_holder(direct, state_id, taker.pid)
        holder.send_signal(signal.SIGCONT)
        _, err = holder.communicate(state_line({"by": "frozen holder"}), timeout=60)
        assert holder.returncode == 4, err.decode(errors="replace")
        assert b"lease" in err
        assert cli.stored(direct, state_id) is None, "the fenced holder wrote the state"

        record = cli.lease_record(direct, state_id)
        assert record is not None
        assert record["pid"] == taker.pid, (
            f"the fenced holder's exit took the new holder's lease: {record}"
        )
        third = cli.run(location, *taker_args, input=state_line({"by": "third run"}))
        assert third.returncode == 3, (
            f"a third run got in beside the new holder (exit {third.returncode}): "
            f"{third.stderr.decode(errors='replace')}"
        )
        assert third.stdout == b""
        _, err = taker.communicate(state_line({"by": "taker"}), timeout=60)
        assert taker.returncode == 0, err.decode(errors="replace")
        assert cli.stored(direct, state_id) == {"by": "taker"}
        assert first["run_id"] != record["run_id"]
    finally:
        for proc in (holder, taker):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("cloud_location", CLOUD, indirect=True)
def test_a_write_in_flight_at_a_takeover_does_not_land(
    cloud_location: StoreLocation, start_proxy: Any, request: pytest.FixtureRequest
) -> None:
    """The holder confirmed its lease and sent its state write; the network holds the write
    for 8 s while the holder's renewals hang, its lease expires and another run takes it
    over. When the old write reaches the server, it must be refused: the takeover fences it.
    """
    kind = cloud_location.emulator.section
    proxy, faulty = start_proxy(cloud_location)
    direct = cloud_location.open()
    state_id = f"chaos-inflight-{uuid.uuid4().hex[:8]}"
    prior = cli.run(cloud_location, "state", "set", state_id, json.dumps({"v": "prior"}))
    assert prior.returncode == 0, prior.stderr
    ttl = 3.0
    holder = cli.spawn_filter(faulty, state_id, str(ttl))
    taker = None
    try:
        cli.wait_for_holder(direct, state_id, holder.pid)
        # the network delivers the holder's state write 8 s late, after the holder gave up on it
        proxy.set_faults(late=1.0, delay_seconds=8, **state_writes(kind, state_id))
        assert holder.stdin is not None
        holder.stdin.write(state_line({"v": "stale holder"}))
        holder.stdin.flush()
        wait_until(
            lambda: proxy.count(fault="late") > 0, "the holder's state write to be sent", timeout=10
        )
        # from now on no write of the old holder gets through: its renewals hang, its lease
        # expires, and another run takes it over before the late writes arrive
        proxy.set_faults(blackhole=1.0, blackhole_seconds=120, **all_writes(kind, state_id))
        taker = cli.spawn(
            cloud_location, "--state-id", state_id, "--lock-wait-seconds", "30",
            "--lock-timeout-seconds", str(ttl),
        )  # fmt: skip
        cli.wait_for_holder(direct, state_id, taker.pid, timeout=30)
        wait_until(
            lambda: proxy.count(fault="late_arrival") >= proxy.count(fault="late"),
            "the late writes to reach the store",
            timeout=20,
        )
        arrived = [r["upstream_status"] for r in proxy.requests() if r["fault"] == "late_arrival"]
        record_figures("write in flight at a takeover", store_of(request.node), late_writes=arrived)
        assert cli.stored(direct, state_id) == {"v": "prior"}, (
            f"a write sent before the takeover landed after it (answers {arrived})"
        )
        assert arrived
        assert all(status in (409, 412) for status in arrived), arrived
        _, err = taker.communicate(b"", timeout=60)
        assert taker.returncode == 0, err.decode(errors="replace")
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the old holder kept running after its lease was taken over")
        assert holder.returncode == 4
    finally:
        for proc in (holder, taker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert cli.stored(direct, state_id) == {"v": "prior"}


# -- clock skew ----------------------------------------------------------------------------

TTL = 2.0
HALF = TTL / 2
#: The clock is the holder's own, whatever the store: S3 too with the full budget.
SKEW_STORES = ("file", "s3") if BUDGET.full else ("file",)


@pytest.mark.parametrize(
    ("holder_skew", "contender_skew"),
    [(0.0, HALF), (0.0, -HALF), (HALF, 0.0), (-HALF, 0.0)],
    ids=["contender+ttl/2", "contender-ttl/2", "holder+ttl/2", "holder-ttl/2"],
)
@pytest.mark.parametrize("kind", SKEW_STORES)
def test_a_skewed_clock_never_takes_a_live_lease(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kind: str,
    holder_skew: float,
    contender_skew: float,
) -> None:
    """A holder keeps its lease for 2.5 TTLs (renewing every TTL/3) while contenders whose
    clocks are off by TTL/2 poll for it: none gets it before the holder lets go."""
    location = a_location(request, kind, tmp_path)
    state_id = f"chaos:skew-{uuid.uuid4().hex[:8]}"
    holder = spec_for(
        location, state_id, ttl=TTL, retry=0.05, rounds=1, hold_seconds=2.5 * TTL,
        clock_skew=holder_skew, seed=1,
    )  # fmt: skip
    contenders = [
        spec_for(
            location,
            state_id,
            ttl=TTL,
            retry=0.05,
            rounds=1,
            hold_ms=10,
            clock_skew=contender_skew,
            seed=2 + i,
            start_after=0.5,
        )
        for i in range(3)
    ]
    logs, procs = run_holders(tmp_path, [holder, *contenders], timeout=120)
    assert not holder_failures(tmp_path, procs), holder_failures(tmp_path, procs)
    held = read_logs(logs)
    first = [h for h in held if h.raw["log"] == 0]
    assert len(first) == 1, first
    assert first[0].kind == "held", first
    assert first[0].until - first[0].got >= 2.5 * TTL - 0.1
    pairs = overlaps(held)
    record_figures(
        "clock skew: live lease",
        kind,
        holder_skew=holder_skew,
        contender_skew=contender_skew,
        contenders=3,
        stolen=len(pairs),
    )
    assert not pairs, f"a contender skewed by {contender_skew:+g}s took a live lease: {pairs}"
    assert [h.kind for h in held] == ["held"] * 4


@pytest.mark.parametrize("skew", [HALF, -HALF], ids=["+ttl/2", "-ttl/2"])
@pytest.mark.parametrize("crashed", ["holder", "contender"])
@pytest.mark.parametrize("kind", SKEW_STORES)
def test_a_crashed_holders_lease_is_taken_over_within_ttl_and_skew(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, crashed: str, skew: float
) -> None:
    """A holder takes the lease and dies without releasing it; one of the two clocks is off
    by TTL/2. The contender takes the lease over no later than TTL + |skew| + the allowance."""
    location = a_location(request, kind, tmp_path)
    state_id = f"chaos:skew-crash-{uuid.uuid4().hex[:8]}"
    holder_skew, contender_skew = (skew, 0.0) if crashed == "holder" else (0.0, skew)
    holder = spec_for(
        location, state_id, ttl=TTL, retry=0.05, rounds=1, hold_ms=1, abandon_rate=1.0,
        clock_skew=holder_skew, seed=1,
    )  # fmt: skip
    contender = spec_for(
        location, state_id, ttl=TTL, retry=0.05, rounds=1, hold_ms=1,
        clock_skew=contender_skew, seed=2, start_after=0.5,
    )  # fmt: skip
    logs, procs = run_holders(tmp_path, [holder, contender], timeout=120)
    assert not holder_failures(tmp_path, procs), holder_failures(tmp_path, procs)
    dead, taker = sorted(read_logs(logs), key=lambda h: h.raw["log"])
    assert dead.kind == "abandoned"
    assert taker.kind == "held"
    waited = taker.got - dead.got
    relative = contender_skew - holder_skew  # how far ahead the contender's clock runs
    expected = TTL + skew_allowance(TTL) - relative
    record_figures(
        "clock skew: crashed holder",
        kind,
        holder_skew=holder_skew,
        contender_skew=contender_skew,
        takeover_after=round(waited, 2),
        bound=round(TTL + abs(skew) + skew_allowance(TTL), 2),
    )
    assert waited <= TTL + abs(skew) + skew_allowance(TTL) + 1.0, (
        f"took the lease over only {waited:.2f}s after the crash"
    )
    assert waited >= expected - 0.5, f"took over after {waited:.2f}s, expected {expected:.2f}s"
