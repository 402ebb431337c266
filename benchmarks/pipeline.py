"""Around a real pipeline: what mapper-state adds to ``tap-sample | target-jsonl``.

The sample tap (``examples/tap-sample``, on the Singer SDK) reads ``records`` rows and
``target-jsonl`` writes them, four ways, all on the local store:

* the bare shell pipeline ``tap | target``, which keeps no state at all;
* ``tap --state FIFO | mapper-state --state-file FIFO | target``, the filter;
* ``mapper-state run --tap ... --target ...``;
* ``meltano run tap-sample target-jsonl`` with Meltano's own ``file://`` state backend,
  in a throw-away copy of this project (Meltano also runs the tap's discovery first).

Each run starts from no state (a fresh store, a fresh output directory), so each one
moves every row; one warm-up run of the bare pipeline and of Meltano is not counted (caches, Meltano's
system database), then rounds alternate the four and
the best of ``repeats`` is kept. Wall time and user+system CPU are the top process's
with every child it waited for (``wait4``), so the tap and the target are included.

Also the time to first byte through the filter: from starting it with input waiting
to the first byte downstream (start-up, lease, state read), against ``cat``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import (
    MAPPER,
    MELTANO,
    TAP_SAMPLE,
    TARGET_JSONL,
    BenchError,
    Row,
    Scale,
    Section,
    Usage,
    clean_env,
    fmt_ms,
    median,
    meltano_project,
    require,
    run_measured,
    workdir,
)

STATE_ID = "bench:tap-sample-to-target-jsonl"
BARE, FILTER, RUN, MELTANO_RUN = (
    "tap | target",
    "tap | mapper-state | target",
    "mapper-state run",
    "meltano run",
)
TTFB_REPEATS = 7
# Warmed up once, not counted: the tap and target (caches), Meltano (its system database
# is created on a project's first run). mapper-state's own start-up stays in the figures.
WARM_UP = (BARE, MELTANO_RUN)


@dataclass(frozen=True)
class Invocation:
    args: list[str]
    cwd: Path
    env: dict[str, str]
    output: Path  # target-jsonl's destination directory


def _sh(*commands: list[str]) -> list[str]:
    """A bash pipeline of ``commands`` that fails when any of them fails."""
    line = " | ".join(shlex.join(c) for c in commands) + " >/dev/null"
    return ["bash", "-o", "pipefail", "-c", line]


def invocations(work: Path, project: Path) -> dict[str, Callable[[int], Invocation]]:
    """How to start run ``i`` of each contender, each with a fresh store and output."""
    data = project / "examples" / "data" / "events.jsonl"
    tap_config = work / "tap.json"
    tap_config.write_text(json.dumps({"data_path": str(data)}))
    env = clean_env(work)
    tap = [TAP_SAMPLE, "--config", str(tap_config)]

    def target(i: int, name: str) -> tuple[list[str], Path]:
        out = work / f"out-{name}-{i}"
        config = work / f"target-{name}-{i}.json"
        config.write_text(json.dumps({"destination_path": str(out), "do_timestamp_file": False}))
        return [TARGET_JSONL, "--config", str(config)], out

    def bare(i: int) -> Invocation:
        tgt, out = target(i, "bare")
        return Invocation(_sh(tap, tgt), work, env, out)

    def filter_(i: int) -> Invocation:
        tgt, out = target(i, "filter")
        fifo = work / f"state-{i}.fifo"
        os.mkfifo(fifo)
        store = f"file://{work / f'store-filter-{i}'}"
        ours = [MAPPER, "--state-id", STATE_ID, "--state-file", str(fifo)]
        return Invocation(
            _sh([*tap, "--state", str(fifo)], [*ours, "--state-backend-uri", store], tgt),
            work,
            env,
            out,
        )

    def run(i: int) -> Invocation:
        tgt, out = target(i, "run")
        store = f"file://{work / f'store-run-{i}'}"
        args = [MAPPER, "run", "--state-id", STATE_ID, "--state-backend-uri", store]
        args += ["--tap", shlex.join(tap), "--target", shlex.join(tgt)]
        return Invocation(args, work, env, out)

    def meltano(i: int) -> Invocation:
        out = work / f"out-meltano-{i}"
        melt_env = {
            **env,
            "MELTANO_STATE_BACKEND_URI": f"file://{work / f'meltano-state-{i}'}",
            "TARGET_JSONL_DESTINATION_PATH": str(out),
        }
        args = [MELTANO, "--log-level=warning", "run", "tap-sample", "target-jsonl"]
        return Invocation(args, project, melt_env, out)

    return {BARE: bare, FILTER: filter_, RUN: run, MELTANO_RUN: meltano}


def delivered(output: Path) -> int:
    path = output / "events.jsonl"
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


FIRST_BYTE = """
import os, sys, time
os.read(0, 1)
print(time.time())
while os.read(0, 1 << 16):
    pass
"""


def first_byte(args: list[str], src: Path, *, cwd: Path, env: dict[str, str]) -> float:
    """Seconds from starting ``args`` (its input waiting in ``src``) to its first output byte."""
    read_end, write_end = os.pipe()
    reader = subprocess.Popen(
        [sys.executable, "-c", FIRST_BYTE], stdin=read_end, stdout=subprocess.PIPE, text=True
    )
    os.close(read_end)
    time.sleep(0.3)  # the reader is up before the clock starts
    with src.open("rb") as stdin:
        started = time.time()
        proc = subprocess.Popen(
            args, stdin=stdin, stdout=write_end, stderr=subprocess.DEVNULL, cwd=cwd, env=env
        )
    os.close(write_end)
    out, _ = reader.communicate(timeout=60)
    if proc.wait(timeout=60) != 0:
        raise BenchError(f"{args[0]} exited {proc.returncode}")
    return float(out) - started


def _first_byte_args(name: str, work: Path, i: int) -> list[str]:
    if name == "cat":
        return ["cat"]
    return [MAPPER, "--state-id", "t", "--state-backend-uri", f"file://{work / f'ttfb-{i}'}"]


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    require(MAPPER, TAP_SAMPLE, TARGET_JSONL, MELTANO)
    section = Section("pipeline", "Around a real pipeline: tap-sample -> target-jsonl")
    with workdir("pipeline") as work:
        project = meltano_project(work, scale.pipeline_records)
        starts = invocations(work, project)
        runs: dict[str, list[Usage]] = {name: [] for name in starts}
        serial = 0
        for round_ in range(scale.repeats + 1):  # round 0 warms up
            label = "warm-up" if round_ == 0 else f"{round_}/{scale.repeats}"
            names = WARM_UP if round_ == 0 else tuple(starts)
            progress(f"round {label}: {', '.join(names)}")
            for name, start in starts.items():
                if round_ == 0 and name not in WARM_UP:
                    continue
                serial += 1
                inv = start(serial)
                usage = run_measured(inv.args, cwd=inv.cwd, env=inv.env, timeout=900)
                got = delivered(inv.output)
                if got != scale.pipeline_records:
                    raise BenchError(
                        f"{name}: the target wrote {got} rows, not {scale.pipeline_records}"
                    )
                if round_:
                    runs[name].append(usage)
        best = {name: Usage.best(r) for name, r in runs.items()}

        progress("time to first byte")
        line = work / "one-record.jsonl"
        line.write_text('{"type":"RECORD","stream":"events","record":{"id":1}}\n')
        env = clean_env(work)
        ttfb: dict[str, float] = {}
        for name in ("cat", "mapper-state"):
            ttfb[name] = median(
                [
                    first_byte(_first_byte_args(name, work, i), line, cwd=work, env=env)
                    for i in range(TTFB_REPEATS)
                ]
            )
    section.data = {
        "records": scale.pipeline_records,
        "contenders": {
            name: {**u.as_dict(), "all_wall_s": [r.wall for r in runs[name]]}
            for name, u in best.items()
        },
        "first_byte_s": ttfb,
    }
    section.rows = rows(scale, best, ttfb)
    return section


def rows(scale: Scale, best: dict[str, Usage], ttfb: dict[str, float]) -> list[Row]:
    bare = best[BARE]
    out = [
        Row(
            f"`{BARE}` (no state kept), {scale.pipeline_records:,} records",
            f"{bare.wall:.2f} s wall, {bare.cpu:.2f} s CPU",
            "",
            "",
            "",
        )
    ]
    for name in (FILTER, RUN, MELTANO_RUN):
        u = best[name]
        added = u.wall - bare.wall
        goal, met = ("", None)
        if name == RUN:
            goal, met = "< 2% + 0.3 s over bare", u.wall <= bare.wall * 1.02 + 0.3
        out.append(
            Row(
                f"`{name}`, {scale.pipeline_records:,} records",
                f"{u.wall:.2f} s wall, {u.cpu:.2f} s CPU",
                f"bare {bare.wall:.2f} s wall, {bare.cpu:.2f} s CPU",
                f"{added:+.2f} s ({added / bare.wall:+.1%}) wall, {u.cpu - bare.cpu:+.2f} s CPU",
                goal,
                met,
            )
        )
    out.append(
        Row(
            "time to first byte through the filter (local store, median)",
            fmt_ms(ttfb["mapper-state"]),
            f"cat {fmt_ms(ttfb['cat'])}",
            f"+{fmt_ms(ttfb['mapper-state'] - ttfb['cat'])}",
            "",
        )
    )
    return out
