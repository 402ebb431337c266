"""Lock hand-over: from a holder's release to the first byte of the run that waited for it.

A holder (the filter, its input held open) keeps the lease on one state ID of the local
store. A second run of the same ID starts with ``lock_wait_seconds`` long enough and its
input ready, and polls every ``lock_retry_seconds``. Then the holder's input closes: it
commits, releases and exits. The release is the moment the lease file stops being the
holder's (watched every half millisecond); the hand-over ends when the waiter's first
byte reaches its reader. Expected: half the poll interval on average, plus one acquire,
one state read and the hand-off; at most one interval plus those.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    MAPPER,
    BenchError,
    Row,
    Scale,
    Section,
    clean_env,
    fmt_ms,
    median,
    require,
    workdir,
)

RETRIES = (1.0, 0.1)
STATE_ID = "bench-handover"
LEASE = "mapper-state.lease.json"
WARM_UP = 1.5  # seconds for the waiter to start and begin polling before the release
LINE = b'{"type":"RECORD","stream":"events","record":{"id":1}}\n'


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"hand-over: {what} within {timeout:g} s")
        time.sleep(0.0005)
    return time.time()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def one_handover(work: Path, retry: float, serial: int, env: dict[str, str]) -> float:
    """Seconds from the holder's release to the waiter's first byte downstream."""
    store = work / f"store-{serial}"
    base = [MAPPER, "--state-id", STATE_ID, "--state-backend-uri", f"file://{store}"]
    lease = store / STATE_ID / LEASE
    holder = subprocess.Popen(
        base, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    assert holder.stdin is not None
    try:
        _wait_for(lambda: lease.exists(), 30, "the holder took no lease")
        held = _read(lease)
        waiter = subprocess.Popen(
            [
                *(*base, "--set", "state_backend.lock_wait_seconds=60"),
                *("--set", f"state_backend.lock_retry_seconds={retry:g}"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert waiter.stdin is not None
        assert waiter.stdout is not None
        waiter.stdin.write(LINE)
        waiter.stdin.close()
        first: list[float] = []

        def read_first() -> None:
            assert waiter.stdout is not None
            if waiter.stdout.read(1):
                first.append(time.time())
            waiter.stdout.read()

        reader = threading.Thread(target=read_first, daemon=True)
        reader.start()
        time.sleep(WARM_UP + random.uniform(0, retry))  # any phase of the waiter's polling
        if waiter.poll() is not None:
            raise BenchError(f"the waiter exited early (code {waiter.returncode})")
        holder.stdin.close()
        released = _wait_for(lambda: _read(lease) != held, 30, "the holder did not release")
        reader.join(timeout=60)
        waiter.wait(timeout=60)
        holder.wait(timeout=60)
        if not first or waiter.returncode != 0 or holder.returncode != 0:
            said = b" | ".join(
                p.stderr.read().strip()[-600:] for p in (holder, waiter) if p.stderr is not None
            ).decode(errors="replace")
            raise BenchError(
                f"hand-over failed (holder {holder.returncode}, waiter {waiter.returncode}): {said}"
            )
        return first[0] - released
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER)
    section = Section("handover", "Lock hand-over: release to the waiting run's first byte")
    by_retry: dict[float, list[float]] = {}
    with workdir("handover") as work:
        env = clean_env(work)
        serial = 0
        for retry in RETRIES:
            progress(f"lock_retry_seconds {retry:g}")
            times = by_retry[retry] = []
            for _ in range(scale.handover_repeats):
                serial += 1
                times.append(one_handover(work, retry, serial, env))
    section.data["by_retry"] = {
        f"{retry:g}": {
            "lock_retry_seconds": retry,
            "median_s": median(times),
            "min_s": min(times),
            "max_s": max(times),
            "all_s": times,
        }
        for retry, times in by_retry.items()
    }
    for retry, times in by_retry.items():
        section.rows.append(
            Row(
                f"hand-over at lock_retry_seconds {retry:g} ({len(times)} runs)",
                f"median {fmt_ms(median(times))}",
                f"min {fmt_ms(min(times))}, max {fmt_ms(max(times))}",
                f"expected: {fmt_ms(retry / 2)} on average + one acquire, state read, hand-off",
                "",
            )
        )
    return section
