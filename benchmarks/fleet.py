"""A fleet: many pipelines, each started by several replicas at the same moment, one bucket.

This is a scheduler on several machines firing the same jobs at once (a retry
overlapping a slow run, two clusters, a manual run). ``pipelines`` x ``replicas``
filters (``mapper-state --state-id fleet:pNN``, ``lock_wait_seconds`` 0) are started
together against one moto bucket behind the counting mitmproxy. Exactly one replica per
pipeline may take the lease: it waits for its input while the others are refused at once
(exit 3, naming the holder). Only once every refused replica has exited does each
holder get its stream (a few records and a STATE) and end, so a holder never releases
before a rival has tried. Then the bucket is checked: one state per pipeline, the
holder's.

One concession to simulating many machines on one small one: the lease TTL is 120 s
instead of 30 s, because a holder starved of CPU by hundreds of starting processes (and
moto and the proxy with it, which stand for a store on other hardware) cannot renew on
time; on a real fleet each replica has its machine to itself. On a busy 2-core machine
the whole takes minutes: every replica pays a Python start-up with boto3.
"""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.common import MAPPER, BenchError, Row, Scale, Section, require, workdir
from benchmarks.wire import Wire, classify, s3_behind_proxy, state_id_of

BUCKET = "bench-fleet"
PREFIX = "fleet"
BUSY = 3  # the documented exit code of a busy lease
TIMEOUT = 900.0
DOCUMENTED = (4, 5)  # lease lost, store error: outcomes to report, not bugs
TTL = "120"  # seconds: lock_timeout_seconds of the replicas


@dataclass
class Replica:
    pipeline: str
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    exited_at: float | None = None

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.perf_counter()
        return code

    def message(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace").strip()


LEASE = "mapper-state.lease.json"


def stream(pipeline: str) -> bytes:
    lines = [
        '{"type":"SCHEMA","stream":"events","schema":{"type":"object"},"key_properties":["id"]}',
        *(f'{{"type":"RECORD","stream":"events","record":{{"id":{i}}}}}' for i in range(1, 11)),
        f'{{"type":"STATE","value":{{"bookmarks":{{"events":{{"id":10,"by":"{pipeline}"}}}}}}}}',
    ]
    return ("\n".join(lines) + "\n").encode()


def _wait(until: Callable[[], bool], what: str, deadline: float) -> None:
    while not until():
        if time.perf_counter() > deadline:
            raise BenchError(f"fleet: {what} within {TIMEOUT:g} s")
        time.sleep(0.02)


def run_fleet(wire: Wire, work: Path, pipelines: int, replicas: int) -> dict[str, Any]:
    env = wire.mapper_env(work)
    uri = f"s3://{BUCKET}/{PREFIX}"
    names = [f"fleet:p{p:03d}" for p in range(pipelines)]
    fleet: list[Replica] = []
    wire.take()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with contextlib.ExitStack() as files:
        total, spawned, settled_at = _drive(fleet, names, replicas, files, env, uri, work, started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        report = _report(wire, fleet, names, pipelines, replicas, (spawned, settled_at, total))
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {**report, "cpu_s": cpu}


def _drive(
    fleet: list[Replica],
    names: list[str],
    replicas: int,
    files: contextlib.ExitStack,
    env: dict[str, str],
    uri: str,
    work: Path,
    started: float,
) -> tuple[float, float, float]:
    """Start every replica, wait for the rivals' refusals, feed the holders, wait for all."""
    deadline = started + TIMEOUT
    try:
        for _ in range(replicas):  # as a scheduler fires them: every pipeline, then again
            for name in names:
                # closed by the ExitStack, after the report has read them
                err = files.enter_context(tempfile.TemporaryFile(dir=work))  # noqa: SIM115
                proc = subprocess.Popen(
                    [
                        *(MAPPER, "--state-id", name),
                        *("--state-backend-uri", uri),
                        *("--set", f"state_backend.lock_timeout_seconds={TTL}"),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    cwd=work,
                    env=env,
                )
                fleet.append(Replica(name, proc, err))
        spawned = time.perf_counter() - started

        def settled() -> bool:
            for r in fleet:
                r.poll()
            alive = Counter(r.pipeline for r in fleet if r.proc.returncode is None)
            return all(alive[n] <= 1 for n in names)

        _wait(settled, "the replicas did not settle to one per pipeline", deadline)
        settled_at = time.perf_counter() - started
        for r in fleet:  # the holders get their streams
            assert r.proc.stdin is not None
            # a holder that has died since (its exit code tells why) refuses its input
            with contextlib.suppress(BrokenPipeError):
                if r.proc.returncode is None:
                    r.proc.stdin.write(stream(r.pipeline))
                r.proc.stdin.close()
        _wait(lambda: all(r.poll() is not None for r in fleet), "the holders did not end", deadline)
        total = time.perf_counter() - started
    finally:
        for r in fleet:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
    return total, spawned, settled_at


def _stranded(wire: Wire, names: list[str]) -> int:
    """How many of ``names`` still have a held lease, now that every replica has exited."""
    client = wire.client()
    held = 0
    for name in names:
        try:
            body = client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}/{LEASE}")["Body"].read()
        except client.exceptions.NoSuchKey:
            continue
        record = json.loads(body)
        held += record.get("status", "held") == "held"
    return held


def _report(
    wire: Wire,
    fleet: list[Replica],
    names: list[str],
    pipelines: int,
    replicas: int,
    times: tuple[float, float, float],
) -> dict[str, Any]:
    spawned, settled_at, total = times
    codes = Counter(r.proc.returncode for r in fleet)
    worked = Counter(r.pipeline for r in fleet if r.proc.returncode == 0)
    refused = [r for r in fleet if r.proc.returncode == BUSY]
    # documented outcomes other than working or refused (a store too slow to answer
    # under the load: exit 5) are reported; anything else is a bug
    failed = [r for r in fleet if r.proc.returncode not in (0, BUSY)]
    unexpected = [r for r in failed if r.proc.returncode not in DOCUMENTED]
    if unexpected:
        raise BenchError(
            f"fleet: {len(unexpected)} replicas failed (exit codes {dict(codes)}), e.g.:\n"
            f"{unexpected[0].message()}"
        )
    unnamed = [r for r in refused if "busy" not in r.message()]
    if unnamed:
        raise BenchError(f"fleet: a refusal without the holder:\n{unnamed[0].message()}")
    for name in names:
        if worked[name] != 1:
            continue
        stored = wire.stored_state(BUCKET, f"{PREFIX}/{name}/state.json")
        if stored != {"bookmarks": {"events": {"id": 10, "by": name}}}:
            raise BenchError(f"fleet: {name} holds {stored}")
    stranded = _stranded(wire, [n for n in names if worked[n] == 0])
    log = wire.take()
    per_pipeline = Counter(state_id_of(e, PREFIX) for e in log)
    stray = per_pipeline.pop(None, 0)
    counts = [per_pipeline[n] for n in names]
    kinds = Counter(classify(e) for e in log)
    return {
        "pipelines": pipelines,
        "replicas": replicas,
        "exit_codes": {str(k): v for k, v in sorted(codes.items())},
        "pipelines_with_exactly_one_run": sum(1 for n in names if worked[n] == 1),
        "pipelines_with_more_than_one_run": sum(1 for n in names if worked[n] > 1),
        "refused": len(refused),
        "other_outcomes": [r.message().splitlines()[-1] for r in failed][:10],
        "pipelines_with_no_run": sum(1 for n in names if worked[n] == 0),
        # why: the last line of each of its replicas (one per pipeline that did not run)
        "why_no_run": [
            next((r.message().splitlines()[-1] for r in failed if r.pipeline == n), "all refused")
            for n in names
            if worked[n] == 0
        ][:10],
        #: pipelines whose lease is still held once every replica has exited
        "stranded_leases": stranded,
        "requests_total": len(log),
        "requests_outside_a_pipeline": stray,
        "requests_per_pipeline": {
            "mean": statistics.fmean(counts),
            "min": min(counts),
            "max": max(counts),
        },
        "request_kinds": dict(sorted(kinds.items())),
        "lock_timeout_seconds": float(TTL),
        "spawn_s": spawned,
        "all_refused_s": settled_at,
        "total_s": total,
    }


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER)
    section = Section("fleet", "A fleet: pipelines x replicas started at once on one bucket")
    p, n = scale.fleet_pipelines, scale.fleet_replicas
    with workdir("fleet") as work, s3_behind_proxy() as wire:
        wire.create_bucket(BUCKET)
        progress(f"{p} pipelines x {n} replicas")
        data = run_fleet(wire, work, p, n)
    section.data = data
    rpp = data["requests_per_pipeline"]
    exact = data["pipelines_with_exactly_one_run"]
    section.rows = [
        Row(
            f"{p} pipelines x {n} replicas started at once (lease TTL {TTL} s): runs that worked",
            f"{exact} of {p} pipelines ran exactly once",
            f"{data['refused']} of {p * (n - 1)} rival replicas refused (exit 3, holder named)",
            "",
            "exactly one run per pipeline",
            exact == p and data["refused"] == p * (n - 1),
        ),
        Row(
            "replicas that ended otherwise (exit code: count)",
            ", ".join(f"{k}: {v}" for k, v in data["exit_codes"].items() if k not in ("0", "3"))
            or "none",
            f"{exact} pipelines ran once, {data['pipelines_with_more_than_one_run']} twice, "
            f"{data['pipelines_with_no_run']} not at all; {data['stranded_leases']} leases "
            "left held",
            (data["why_no_run"] or data["other_outcomes"] or [""])[0][:160],
            "no pipeline runs twice; no lease left held",
            data["pipelines_with_more_than_one_run"] == 0 and data["stranded_leases"] == 0,
        ),
        Row(
            "requests per pipeline (all its replicas)",
            f"{rpp['mean']:.1f} on average",
            f"min {rpp['min']}, max {rpp['max']}; {data['requests_total']:,} in all",
            ", ".join(f"{k} {v}" for k, v in data["request_kinds"].items()),
        ),
        Row(
            "time: every replica started / every rival refused / all done",
            f"{data['total_s']:.1f} s in all, {data['cpu_s']:.0f} s CPU "
            f"({data['cpu_s'] / (p * n):.2f} s per replica)",
            f"{data['spawn_s']:.1f} s / {data['all_refused_s']:.1f} s / {data['total_s']:.1f} s",
            "",
        ),
    ]
    return section
