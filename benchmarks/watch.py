"""Watching a fleet: what one Prometheus scrape of ``mapper-state metrics serve`` costs.

A bucket on moto is seeded (straight into moto's backend) with ``watch_pipelines`` state IDs
as runs leave them: ``state.json``, a released lease and ``watch_runs`` run records each
(the ``runs_keep`` default: a fleet that has run for a while). Then, through the counting
mitmproxy: ``mapper-state metrics`` (one look at the store, nothing remembered), and
``metrics serve`` scraped three times: a first scrape, one after the cache has expired
with nothing changed in the store (the steady state: listings only), and one within
``--cache-seconds`` (answered from the cache: no request). Each scrape's output is checked
(every pipeline exposed).
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MAPPER,
    BenchError,
    Row,
    Scale,
    Section,
    fmt_int,
    require,
    run_measured,
    workdir,
)
from benchmarks.wire import Wire, breakdown, count_keys, s3_behind_proxy, seed

BUCKET = "bench-watch"
PREFIX = "fleet"
CACHE_SECONDS = 2.0
#: Seeded objects this old are remembered between looks (``ops.watch.SETTLED_SECONDS``).
SETTLE = 6.0


def state_id(i: int) -> str:
    return f"prod:tap-{i:05d}-to-target-jsonl"


def objects(pipelines: int, records: int) -> Iterator[tuple[str, bytes]]:
    """Every key of a fleet of ``pipelines`` with ``records`` run records each."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(pipelines):
        sid = state_id(i)
        doc = {"completed": {"singer_state": {"bookmarks": {"s": {"id": i}}}}, "partial": {}}
        yield f"{PREFIX}/{sid}/state.json", json.dumps(doc).encode()
        now = start.timestamp() + i
        lease = {
            "run_id": f"{i:06x}",
            "host": "worker-1",
            "pid": 7,
            "command": "mapper-state run",
            "acquired_at": now,
            "renewed_at": now,
            "expires_at": now,
            "ttl_seconds": 30.0,
            "status": "released",
        }
        yield f"{PREFIX}/{sid}/mapper-state.lease.json", json.dumps(lease).encode()
        for r in range(records):
            when = start + timedelta(hours=r, microseconds=i)
            run_id = f"{i:06x}{r:04x}"
            record = {
                "state_id": sid,
                "run_id": run_id,
                "host": "worker-1",
                "pid": 7,
                "command": "mapper-state run",
                "mode": "run",
                "started_at": when.isoformat().replace("+00:00", "Z"),
                "status": "failed" if i % 10 == 0 and r == records - 1 else "succeeded",
                "ended_at": (when + timedelta(minutes=5)).isoformat().replace("+00:00", "Z"),
                "exit_code": 8 if i % 10 == 0 and r == records - 1 else 0,
                "records": 1000,
                "bytes": 100_000,
                "states_seen": 10,
                "states_committed": 3,
                "lease_wait_seconds": 0.01,
                "lease_ttl_seconds": 30.0,
            }
            name = f"{when.strftime('%Y%m%dT%H%M%S.%fZ')}-{run_id}"
            yield f"{PREFIX}/.mapper-state/runs/{sid}/{name}.json", json.dumps(record).encode()


@dataclass(frozen=True)
class Scrape:
    """One scrape: its wall time, and the store requests it made."""

    wall_s: float
    requests: int
    breakdown: str


def _exposed(text: str, pipelines: int, what: str) -> None:
    shown = text.count("mapper_state_lease_held{")
    if shown != pipelines:
        raise BenchError(f"watch: {what} exposed {shown} of {pipelines} pipelines")


def _scrape(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as answer:
        text = answer.read().decode()
    return time.perf_counter() - started, text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER)
    section = Section("watch", "Watching a fleet: one Prometheus scrape of `metrics serve` (S3)")
    n, r = scale.watch_pipelines, scale.watch_runs
    uri = f"s3://{BUCKET}/{PREFIX}"
    with workdir("watch") as work, s3_behind_proxy() as wire:
        wire.create_bucket(BUCKET)
        progress(f"{fmt_int(n)} pipelines x {r} run records: seeding")
        keys = seed(wire, BUCKET, objects(n, r))
        if count_keys(wire, BUCKET, f"{PREFIX}/") != keys:
            raise BenchError(f"seeding {BUCKET} left fewer than {keys} keys")
        time.sleep(SETTLE)
        env = wire.mapper_env(work)
        progress("mapper-state metrics")
        wire.take()
        with tempfile.TemporaryFile() as out:
            usage = run_measured(
                [MAPPER, "metrics", "--state-backend-uri", uri], cwd=work, env=env, stdout=out
            )
            out.seek(0)
            _exposed(out.read().decode(), n, "mapper-state metrics")
        once = wire.take_kinds()
        scrapes = _serve_and_scrape(wire, work, env, uri, n, progress)
    section.data = {
        "pipelines": n,
        "run_records_each": r,
        "keys": keys,
        "listing_pages_bound": listing_pages(n, r),
        "metrics": {"wall_s": usage.wall, "requests": len(once), "breakdown": breakdown(once)},
        "scrapes": [asdict(s) for s in scrapes],
    }
    section.rows, section.notes = rows(section.data)
    return section


def listing_pages(pipelines: int, records: int) -> int:
    """The listing requests of one look: the states' listing (a state and a lease each, and
    one page where it meets the reserved range and jumps past it), the run records'."""
    return math.ceil(2 * pipelines / 1000) + 1 + math.ceil(pipelines * records / 1000)


def rows(data: dict[str, Any]) -> tuple[list[Row], list[str]]:
    """The scoreboard's rows from the figures (``results/watch.json``'s ``data``)."""
    n, r, pages = data["pipelines"], data["run_records_each"], data["listing_pages_bound"]
    once = data["metrics"]
    first, steady, cached = (Scrape(**s) for s in data["scrapes"])
    out = [
        Row(
            f"`mapper-state metrics`, {fmt_int(n)} pipelines x {r} run records",
            f"{once['wall_s']:.1f} s, {fmt_int(once['requests'])} requests",
            f"{fmt_int(data['keys'])} keys in the bucket",
            once["breakdown"],
        ),
        Row(
            "`metrics serve`: first scrape (with the first look, begun at start)",
            f"{first.wall_s:.1f} s, {fmt_int(first.requests)} requests",
            "every lease and newest run record read once",
            first.breakdown,
        ),
        Row(
            "`metrics serve`: next scrape, nothing changed",
            f"{steady.wall_s:.1f} s, {fmt_int(steady.requests)} requests",
            f"listings only: ceil(2N/1000) + 1 + ceil(N x {r}/1000) = {pages} pages",
            steady.breakdown,
            f"at most {pages} requests",
            steady.requests <= pages,
        ),
        Row(
            f"`metrics serve`: a scrape within --cache-seconds {CACHE_SECONDS:g}",
            f"{cached.wall_s:.2f} s, {fmt_int(cached.requests)} requests",
            "answered from the cache",
            cached.breakdown or "none",
            "no request",
            cached.requests == 0,
        ),
    ]
    notes = [
        "Command: `python -m benchmarks.run --only watch`. One scrape costs two listings "
        "(states and leases; run records), paged at 1,000 keys, plus one read of each lease "
        "and newest run record that changed since the previous scrape (docs/operations.md, "
        "\"Watching a fleet\"). Wall times are moto's and mitmproxy's on a shared 2-core "
        "machine; the request counts are what a store is asked."
    ]
    return out, notes


def _serve_and_scrape(
    wire: Wire,
    work: Path,
    env: dict[str, str],
    uri: str,
    pipelines: int,
    progress: Callable[[str], None],
) -> list[Scrape]:
    """Three scrapes of ``metrics serve``: first, after the cache expired, within it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    wire.take()  # the first look begins as the server starts: the first scrape counts it
    serve = subprocess.Popen(
        [
            *(MAPPER, "metrics", "serve", "--state-backend-uri", uri),
            *("--listen", f"127.0.0.1:{port}", "--cache-seconds", f"{CACHE_SECONDS:g}"),
        ],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=2)
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if time.monotonic() > deadline or serve.poll() is not None:
                    raise BenchError("watch: metrics serve did not start") from None
                time.sleep(0.1)
        results = []
        for what, pause in (("first", 0.0), ("steady", CACHE_SECONDS + 0.5), ("cached", 0.0)):
            time.sleep(pause)
            progress(f"metrics serve: {what} scrape")
            if what != "first":
                wire.take()
            wall, text = _scrape(url)
            kinds = wire.take_kinds()
            _exposed(text, pipelines, f"the {what} scrape")
            results.append(Scrape(wall, len(kinds), breakdown(kinds)))
        return results
    finally:
        serve.terminate()
        serve.wait(timeout=30)
