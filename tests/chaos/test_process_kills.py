"""Process faults in the real pipeline: SIGKILL of mapper-state, of the tap or of the target,
at random moments, in ``mapper-state run`` with tap-postgres and target-jsonl against a
throw-away PostgreSQL cluster and a real store.

After every round the next run completes; all the rows delivered so far together cover
every source row (at-least-once); and the stored state is never ahead of what the target
wrote: every row up to the stored bookmark has been delivered.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import datetime
from typing import Any

import pytest

from tests.chaos.conftest import FULL, STORES, ChaosBudget, record_figures
from tests.e2e.conftest import (  # noqa: F401  (fixtures)
    BASE_TIME,
    Mapper,
    Source,
    Store,
    Target,
    children_of,
    discovered_catalog,
    jsonl,
    kill_if_running,
    mapper,
    real_tools,
    source,
    state_id,
    store,
)

pytestmark = pytest.mark.e2e

TTL = 3.0
LEASE = ("--lock-timeout-seconds", str(TTL), "--lock-retry-seconds", "0.2")
VICTIMS = ("mapper-state", "tap", "target")
#: The local store and S3 (moto) always; at the full budget (``make chaos``) every store
#: of the suite: Ceph RGW, Azure, GCS and PostgreSQL (the very server the tap reads).
KILL_STORES = ["local", "s3", *(s for s in STORES if FULL and s not in ("file", "s3"))]


def bookmark_id(value: Any, stream: str) -> int:
    """The row id a tap-postgres bookmark stands for (row i is updated at BASE_TIME + i min)."""
    if not value:
        return 0
    when = datetime.fromisoformat(value["bookmarks"][stream]["replication_key_value"])
    if when.tzinfo is None:
        when = when.replace(tzinfo=BASE_TIME.tzinfo)
    return round((when - BASE_TIME).total_seconds() / 60)


def kill(proc: Any, victim: str) -> bool:
    """SIGKILL the victim of this round if it is running; whether it was."""
    if proc.poll() is not None:
        return False
    if victim == "mapper-state":
        proc.send_signal(signal.SIGKILL)
        return True
    name = "tap-postgres" if victim == "tap" else "target-jsonl"
    pids = [pid for pid, cmd in children_of(proc.pid).items() if name in cmd]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
    return bool(pids)


@pytest.mark.parametrize("store", KILL_STORES, indirect=True)
def test_random_kills_lose_no_row_and_never_store_a_state_ahead(
    source: Source,  # noqa: F811
    jsonl: Target,  # noqa: F811
    store: Store,  # noqa: F811
    mapper: Mapper,  # noqa: F811
    state_id: str,  # noqa: F811
    chaos_budget: ChaosBudget,
) -> None:
    rng = random.Random(4242)
    stream = source.stream
    runs: list[str] = []
    delivered: set[int] = set()
    total = 5
    source.insert(1, total)
    started = time.monotonic()
    first = mapper.run(state_id, source, jsonl, "first", *LEASE)
    duration = time.monotonic() - started
    assert first.returncode == 0, first.stderr
    runs.append("first")
    delivered.update(jsonl.delivered("first", stream))
    kills = {v: 0 for v in VICTIMS}
    missed = 0
    exits: dict[str, int] = {}
    rounds = chaos_budget.kill_rounds
    for r in range(rounds):
        new = rng.randint(1_000, 15_000)
        source.insert(total + 1, total + new)
        total += new
        victim = rng.choice(VICTIMS)
        moment = rng.uniform(0, duration * 1.5)
        name = f"killed-{r}"
        proc = mapper.spawn(
            state_id, source, jsonl, name, *LEASE, "--checkpoint-interval-seconds", "0"
        )
        try:
            time.sleep(moment)
            if kill(proc, victim):
                kills[victim] += 1
            else:
                missed += 1
            code = proc.wait(timeout=120)
        finally:
            kill_if_running(proc)
        exits[str(code)] = exits.get(str(code), 0) + 1
        runs.append(name)
        delivered.update(jsonl.delivered(name, stream))
        doc = store.document(state_id)
        ahead = bookmark_id(doc and doc["completed"]["singer_state"], stream)
        gaps = set(range(1, ahead + 1)) - delivered
        assert not gaps, (
            f"round {r} ({victim} killed at {moment:.2f}s, exit {code}): the stored bookmark is "
            f"row {ahead} but {len(gaps)} rows up to it were never delivered, e.g. {sorted(gaps)[:5]}"
        )
        # the next run completes (waiting out a dead holder's lease), from the stored state
        name = f"next-{r}"
        after = mapper.run(state_id, source, jsonl, name, *LEASE, "--lock-wait-seconds", "60")
        assert after.returncode == 0, (
            f"round {r}: the run after the kill failed:\n{after.stderr[-3000:]}"
        )
        runs.append(name)
        delivered.update(jsonl.delivered(name, stream))
        missing = set(range(1, total + 1)) - delivered
        assert not missing, (
            f"round {r}: {len(missing)} rows never delivered, e.g. {sorted(missing)[:5]}"
        )
        assert mapper.state_get(state_id) == source.state(total)
        assert store.lease(state_id) is None
    record_figures(
        "SIGKILL in tap-postgres -> mapper-state run -> target-jsonl",
        store.name,
        rounds=rounds,
        kills=kills,
        kill_missed_the_run=missed,
        exits=exits,
        source_rows=total,
        rows_delivered=sum(len(jsonl.delivered(run, stream)) for run in runs),
        rows_lost=0,
        states_ahead=0,
    )
