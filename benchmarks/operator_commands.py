"""Operator commands at scale: ``state list``, ``get`` and ``export`` on a bucket of many IDs.

Buckets on moto are seeded straight into moto's backend in Meltano's layout:
``states/<state_id>/state.json`` = ``{"completed": {"singer_state": ...}, "partial": {}}``
and, per state ID, ``history`` snapshots as mapper-state keeps them
(``states/<state_id>/history/<yyyymmddThhmmss.ffffffZ>-<run_id>.json``). One bucket per
size: state IDs grow along ``operator_ids`` (with ``operator_history`` snapshots each),
and history grows along ``history_lengths`` (with ``history_ids`` state IDs).

On each bucket, through the counting mitmproxy: ``mapper-state state list``,
``state get ID``, ``state export``, and Meltano's ``meltano state list`` and
``meltano state get ID`` (its S3 backend, the same bucket); wall time and requests,
each output checked (every ID listed, every state exported).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MAPPER,
    MELTANO,
    BenchError,
    Row,
    Scale,
    Section,
    fmt_int,
    meltano_project,
    require,
    run_measured,
    workdir,
)
from benchmarks.wire import Wire, breakdown, count_keys, s3_behind_proxy, seed
from mapper_state.core.history import iso_time

PREFIX = "states"
ALL_COMMANDS = (
    "mapper-state state list",
    "mapper-state state get",
    "mapper-state state export",
    "meltano state list",
    "meltano state get",
)
LIST_COMMANDS = ("mapper-state state list", "meltano state list")


def state_id(i: int) -> str:
    return f"dev:tap-{i:05d}-to-target-jsonl"


def objects(ids: int, history: int) -> Iterator[tuple[str, bytes]]:
    """Every key of a bucket with ``ids`` state IDs and ``history`` snapshots of each."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(ids):
        sid = state_id(i)
        value = {"bookmarks": {"events": {"replication_key": "id", "replication_key_value": i}}}
        doc = {"completed": {"singer_state": value}, "partial": {}}
        yield f"{PREFIX}/{sid}/state.json", json.dumps(doc).encode()
        for h in range(history):
            when = start + timedelta(hours=h, microseconds=i)
            run_id = f"{i:06x}{h:06x}"
            name = f"{when.strftime('%Y%m%dT%H%M%S.%fZ')}-{run_id}"
            snapshot = {
                "state_id": sid,
                "time": iso_time(when),
                "run_id": run_id,
                "host": "worker-1",
                "command": "mapper-state run",
                "note": "",
                "singer_state": value,
            }
            yield f"{PREFIX}/{sid}/history/{name}.json", json.dumps(snapshot).encode()


@dataclass(frozen=True)
class Result:
    command: str
    ids: int
    history: int
    seconds: float
    requests: int
    kinds: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "state_ids": self.ids,
            "history": self.history,
            "wall_s": self.seconds,
            "requests": self.requests,
            "breakdown": breakdown(self.kinds),
        }


def run_command(
    wire: Wire, name: str, bucket: str, work: Path, project: Path, ids: int
) -> tuple[float, list[str]]:
    """Run one operator command on ``bucket``; its wall time and its requests."""
    uri = f"s3://{bucket}/{PREFIX}"
    sample = state_id(ids // 2)
    tool, _, verb = name.partition(" ")
    verb_args = verb.split()
    if verb_args[-1] == "get":
        verb_args.append(sample)
    if tool == "mapper-state":
        args = [MAPPER, *verb_args, "--state-backend-uri", uri]
        env, cwd = wire.mapper_env(work), work
    else:
        args = [MELTANO, "--log-level=warning", *verb_args]
        env, cwd = wire.meltano_env(work, uri), project
    wire.take()
    with tempfile.TemporaryFile() as out:
        usage = run_measured(args, cwd=cwd, env=env, stdout=out, timeout=1200)
        out.seek(0)
        text = out.read().decode()
    kinds = wire.take_kinds()
    lines = [line for line in text.splitlines() if line.strip()]
    if verb_args[-1] in ("list", "export") and len(lines) != ids:
        raise BenchError(f"{name} on {ids} state IDs printed {len(lines)} lines")
    if verb_args[-2:] == ["get", sample]:
        value = json.loads(text)
        value = value.get("singer_state", value)
        if value["bookmarks"]["events"]["replication_key_value"] != ids // 2:
            raise BenchError(f"{name} {sample} printed {text[:200]}")
    return usage.wall, kinds


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER, MELTANO)
    section = Section("operator", "Operator commands at scale (S3, Meltano's layout)")
    datasets: dict[tuple[int, int], tuple[str, ...]] = {}
    for ids in scale.operator_ids:
        datasets[(ids, scale.operator_history)] = ALL_COMMANDS
    for history in scale.history_lengths:
        datasets.setdefault((scale.history_ids, history), LIST_COMMANDS)
    results: list[Result] = []
    with workdir("operator") as work, s3_behind_proxy() as wire:
        project = meltano_project(work, 1)
        for (ids, history), commands in sorted(datasets.items()):
            bucket = f"ops-{ids}-h{history}"
            wire.create_bucket(bucket)
            progress(f"{fmt_int(ids)} state IDs x {history} snapshots: seeding")
            n = seed(wire, bucket, objects(ids, history))
            if count_keys(wire, bucket, f"{PREFIX}/") != n:
                raise BenchError(f"seeding {bucket} left fewer than {n} keys")
            for name in commands:
                progress(f"{fmt_int(ids)} state IDs x {history} snapshots: {name}")
                seconds, kinds = run_command(wire, name, bucket, work, project, ids)
                results.append(Result(name, ids, history, seconds, len(kinds), kinds))
    section.data["results"] = [r.as_dict() for r in results]
    section.data["prefix_layout"] = f"{PREFIX}/<state_id>/state.json + history/"
    section.rows, section.notes = rows(scale, results)
    return section


def rows(scale: Scale, results: list[Result]) -> tuple[list[Row], list[str]]:
    by = {(r.command, r.ids, r.history): r for r in results}
    largest = max(scale.operator_ids)
    h = scale.operator_history
    out = []
    for name in ALL_COMMANDS:
        r = by[(name, largest, h)]
        peers = "; ".join(
            f"{fmt_int(n)} IDs: {_requests(by[(name, n, h)].requests)}, {by[(name, n, h)].seconds:.1f} s"
            for n in sorted(scale.operator_ids)
            if n != largest
        )
        out.append(
            Row(
                f"`{name}`, {fmt_int(largest)} state IDs x {h} snapshots",
                f"{r.seconds:.1f} s, {_requests(r.requests)}",
                peers,
                breakdown(r.kinds),
            )
        )
    notes = []
    small, big = min(scale.operator_ids), largest
    for name in ALL_COMMANDS:
        a, b = by[(name, small, h)], by[(name, big, h)]
        per_thousand = (b.requests - a.requests) / (big - small) * 1000
        growth = (
            f"`{name}`: {_requests(a.requests)} at {fmt_int(small)} state IDs, "
            f"{b.requests:,} at {fmt_int(big)}: {per_thousand:,.1f} more per 1,000 IDs"
        )
        if name in LIST_COMMANDS:
            lengths = sorted(scale.history_lengths)
            counts = [by[(name, scale.history_ids, n)].requests for n in lengths]
            shown = ", ".join(f"{c:,} with {n}" for c, n in zip(counts, lengths, strict=True))
            grows = counts[-1] > counts[0]
            growth += f"; at {fmt_int(scale.history_ids)} IDs: {shown} snapshots each" + (
                " -- **the listing cost grows with history length** (every history "
                "key under the prefix is listed, 1,000 keys per LIST page)"
                if grows
                else " -- independent of history length"
            )
        notes.append(growth + ".")
    return out, notes


def _requests(n: int) -> str:
    return f"{n:,} request" + ("" if n == 1 else "s")
