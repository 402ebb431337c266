"""The filter on its own: throughput, CPU per GB, memory and start-up, against ``cat``.

Every stream goes through ``cat FILE | X | cat >/dev/null`` with X = ``cat``,
X = ``mapper-state`` (the local store) and, on smaller streams because it is slow,
X = ``meltano-map-transform`` (the Singer SDK's no-op mapper). Runs are interleaved
(one of each, then the next round) and the best of ``repeats`` is kept, so a noisy
machine slows every contender alike.

* Throughput and CPU per GB are slopes between two stream sizes: the difference in
  seconds (wall, or user+system CPU of X) over the difference in bytes, so start-up and
  the final commit cancel out. A shared CI runner pays for CPU, not wall time.
* Stream shapes: each plain stream size alone (start-up included), a stream whose every
  record holds ``"STATE"``, one huge RECORD line (peak RSS), a STATE after every record
  (how many commits the checkpointer makes of them).
* A store taking 500 ms per request, with a checkpoint after every state: the time until
  the reader downstream has the last byte, against an instant store.
* ``mapper-state --version``: start-up, and which heavy modules it imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import streams
from benchmarks.common import (
    MAP_TRANSFORM,
    MAPPER,
    BenchError,
    Row,
    Scale,
    Section,
    Usage,
    clean_env,
    done_counts,
    fmt_int,
    fmt_ms,
    require,
    wait_usage,
    workdir,
)

TIMEOUT = 900.0


def pipe_through(
    src: Path, middle: Sequence[str], *, cwd: Path, env: dict[str, str]
) -> tuple[Usage, bytes]:
    """``cat src | middle | cat >/dev/null``: the whole's wall time, the middle's CPU and RSS.

    Also the middle's stderr (mapper-state's last line counts its states and commits).
    """
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        head = subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE)
        mid = subprocess.Popen(
            list(middle), stdin=head.stdout, stdout=subprocess.PIPE, stderr=err, cwd=cwd, env=env
        )
        assert head.stdout is not None
        assert mid.stdout is not None
        head.stdout.close()
        tail = subprocess.Popen(["cat"], stdin=mid.stdout, stdout=subprocess.DEVNULL)
        mid.stdout.close()
        code, cpu, rss = wait_usage(mid, TIMEOUT)
        head.wait()
        tail.wait()
        wall = time.perf_counter() - started
        err.seek(0)
        log = err.read()
    if code != 0:
        raise BenchError(f"{middle[0]} exited {code}:\n{log.decode(errors='replace')[-2000:]}")
    return Usage(wall, cpu, rss), log


LAST_BYTE = """
import os, sys, time
remaining = int(sys.argv[1])
while remaining > 0:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    remaining -= len(chunk)
print(time.time())
while os.read(0, 1 << 20):
    pass
"""


def time_to_last_byte(src: Path, middle: Sequence[str], cwd: Path, env: dict[str, str]) -> float:
    """Seconds until the reader downstream has every byte (the final commit excluded)."""
    started = time.time()
    with src.open("rb") as stdin:
        mid = subprocess.Popen(
            list(middle),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
        )
        assert mid.stdout is not None
        out = subprocess.run(
            [sys.executable, "-c", LAST_BYTE, str(src.stat().st_size)],
            stdin=mid.stdout,
            capture_output=True,
            text=True,
            check=True,
        )
        mid.stdout.close()
        mid.wait()
    return float(out.stdout) - started


def startup(env: dict[str, str], cwd: Path) -> tuple[float, list[str]]:
    """Least seconds of 10 ``mapper-state --version``, and the heavy modules it imports."""
    times = []
    for _ in range(10):
        started = time.perf_counter()
        subprocess.run([MAPPER, "--version"], check=True, capture_output=True, env=env, cwd=cwd)
        times.append(time.perf_counter() - started)
    probe = (
        "import sys; sys.argv=['mapper-state','--version']\n"
        "from mapper_state.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('loaded:' + ','.join(m for m in ('boto3', 'botocore', 'azure', 'google',"
        " 'psycopg', 'singer_sdk') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=cwd
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("loaded:"))
    return min(times), [m for m in line.removeprefix("loaded:").split(",") if m]


def measure(scale: Scale, progress: Callable[[str], None]) -> Section:
    section = Section("filter", "The filter: throughput, CPU, memory, start-up")
    with workdir("filter") as work:
        _measure(scale, work, section, progress)
    return section


def _sdk_streams(scale: Scale, work: Path) -> tuple[dict[int, Path], list[str]]:
    """The streams meltano-map-transform is measured on, and its command (a no-op mapping)."""
    sdk = {n: streams.plain(work / f"sdk-{n}.jsonl", n) for n in scale.map_transform_lines}
    config = work / "map.json"
    config.write_text(json.dumps({"stream_maps": {}}))
    return sdk, [MAP_TRANSFORM, "--config", str(config)]


def _measure(scale: Scale, work: Path, section: Section, progress: Callable[[str], None]) -> None:
    require(MAPPER)
    env = clean_env(work, MAPPER_STATE_HISTORY_KEEP="0")  # no snapshot per run: the stream only
    store = f"file://{work / 'store'}"
    ours = [MAPPER, "--state-id", "bench", "--state-backend-uri", store]
    small, large = scale.slope_lines
    progress("writing the streams")
    sizes = {*scale.slope_lines, *scale.shape_lines, scale.every_state_lines}
    plain = {n: streams.plain(work / f"plain-{n}.jsonl", n) for n in sorted(sizes)}
    state_text = {
        n: streams.state_text(work / f"state-text-{n}.jsonl", n) for n in scale.state_text_lines
    }
    huge = streams.huge_line(work / "huge-line.jsonl", scale.huge_line_mb)
    every = streams.every_state(work / "every-state.jsonl", scale.every_state_lines)
    has_map_transform = os.access(MAP_TRANSFORM, os.X_OK)
    sdk, sdk_cmd = _sdk_streams(scale, work) if has_map_transform else ({}, [])

    # (contender, stream kind, lines) -> command and file; every one measured each round
    cases: dict[tuple[str, str, int], tuple[list[str], Path]] = {}
    for n, path in plain.items():
        cases[("cat", "plain", n)] = (["cat"], path)
        cases[("mapper-state", "plain", n)] = (ours, path)
    for n, path in state_text.items():
        cases[("cat", "state-text", n)] = (["cat"], path)
        cases[("mapper-state", "state-text", n)] = (ours, path)
    cases[("cat", "huge-line", 1)] = (["cat"], huge)
    cases[("mapper-state", "huge-line", 1)] = (ours, huge)
    for n, path in sdk.items():
        cases[("meltano-map-transform", "plain", n)] = (sdk_cmd, path)
        cases[("cat", "sdk-plain", n)] = (["cat"], path)
        cases[("mapper-state", "sdk-plain", n)] = (ours, path)
    runs: dict[tuple[str, str, int], list[Usage]] = {key: [] for key in cases}
    for round_ in range(1, scale.repeats + 1):
        progress(f"pipe-through round {round_}/{scale.repeats} ({len(cases)} runs)")
        for key, (cmd, path) in cases.items():
            runs[key].append(pipe_through(path, cmd, cwd=work, env=env)[0])
    best = {key: Usage.best(r) for key, r in runs.items()}
    size = {key: streams.megabytes(path) for key, (_, path) in cases.items()}

    def rates(tool: str, kind: str, sizes: tuple[int, int]) -> dict[str, float]:
        a, b = (tool, kind, sizes[0]), (tool, kind, sizes[1])
        megabytes = size[b] - size[a]
        wall, cpu = best[b].wall - best[a].wall, best[b].cpu - best[a].cpu
        if wall <= 0 or cpu <= 0:  # lost in the noise: the larger run whole, start-up included
            return {
                "mb_per_s": size[b] / best[b].wall,
                "cpu_s_per_gb": best[b].cpu / (size[b] / 1000),
                "slope": False,
            }
        return {
            "mb_per_s": megabytes / wall,
            "cpu_s_per_gb": cpu / (megabytes / 1000),
            "slope": True,
        }

    slopes: dict[str, dict[str, float]] = {
        "cat": rates("cat", "plain", scale.slope_lines),
        "mapper-state": rates("mapper-state", "plain", scale.slope_lines),
        "cat, every record holds STATE": rates("cat", "state-text", scale.state_text_lines),
        "mapper-state, every record holds STATE": rates(
            "mapper-state", "state-text", scale.state_text_lines
        ),
    }
    if sdk:
        slopes["meltano-map-transform"] = rates(
            "meltano-map-transform", "plain", scale.map_transform_lines
        )
        slopes["cat (map-transform's sizes)"] = rates("cat", "sdk-plain", scale.map_transform_lines)
        slopes["mapper-state (map-transform's sizes)"] = rates(
            "mapper-state", "sdk-plain", scale.map_transform_lines
        )
    section.data["slope"] = {
        "between_lines": list(scale.slope_lines),
        "state_text_between_lines": list(scale.state_text_lines),
        "map_transform_between_lines": list(scale.map_transform_lines),
        "contenders": slopes,
    }
    section.data["runs"] = [
        {
            "contender": tool,
            "stream": kind,
            "lines": n,
            "mb": size[(tool, kind, n)],
            **best[(tool, kind, n)].as_dict(),
            "all_wall_s": [u.wall for u in runs[(tool, kind, n)]],
        }
        for (tool, kind, n) in cases
    ]

    # STATE after every record: how many commits, default interval and none
    progress("a STATE after every record")
    every_runs: dict[str, Any] = {}
    for interval in ("5", "0"):
        usages, counts = [], (0, 0)
        for i in range(scale.repeats):
            fresh = f"file://{work / f'every-state-{interval}-{i}'}"  # no prior state
            cmd = [
                *ours[:3],
                "--state-backend-uri",
                fresh,
                "--checkpoint-interval-seconds",
                interval,
            ]
            usage, log = pipe_through(every, cmd, cwd=work, env=env)
            usages.append(usage)
            counts = done_counts(log)
        u = Usage.best(usages)
        every_runs[interval] = {
            "interval_s": float(interval),
            "states": counts[0],
            "commits": counts[1],
            "mb_per_s": streams.megabytes(every) / u.wall,
            **u.as_dict(),
        }
    section.data["every_state"] = {"lines": scale.every_state_lines, "runs": every_runs}

    # a slow store: when has the reader downstream got the last byte?
    progress("a store taking 500 ms per request")
    fast = [*ours[:3], "--checkpoint-interval-seconds", "0", "--state-backend-uri", "memory://b"]
    slow = [*fast[:-1], "memory://b?latency_ms=500"]
    streaming: dict[str, float] = {}
    for name, cmd in (("instant store", fast), ("500 ms store", slow)):
        t = {
            n: min(time_to_last_byte(plain[n], cmd, work, env) for _ in range(scale.repeats))
            for n in scale.slope_lines
        }
        mb = {n: streams.megabytes(plain[n]) for n in scale.slope_lines}
        streaming[name] = (mb[large] - mb[small]) / max(t[large] - t[small], 1e-9)
    section.data["slow_store"] = {"mb_per_s": streaming}

    progress("start-up")
    seconds, loaded = startup(env, work)
    section.data["startup"] = {"version_s": seconds, "heavy_modules_loaded": loaded}
    section.rows = rows(scale, section.data, has_map_transform)


def rows(scale: Scale, data: dict[str, Any], has_map_transform: bool) -> list[Row]:
    s = data["slope"]["contenders"]
    cat, ours = s["cat"], s["mapper-state"]
    small, large = scale.slope_lines
    between = f"{_lines(small)} -> {_lines(large)} lines"
    out = [
        Row(
            f"throughput, slope {between}",
            f"{ours['mb_per_s']:,.0f} MB/s",
            f"cat {cat['mb_per_s']:,.0f} MB/s",
            f"{ours['mb_per_s'] / cat['mb_per_s']:.2f}x cat",
            ">= 0.9x cat",
            ours["mb_per_s"] >= 0.9 * cat["mb_per_s"],
        ),
        Row(
            f"CPU per GB (user+sys), slope {between}",
            f"{ours['cpu_s_per_gb']:.2f} s/GB",
            f"cat {cat['cpu_s_per_gb']:.2f} s/GB",
            f"{ours['cpu_s_per_gb'] / cat['cpu_s_per_gb']:.2f}x cat",
            "<= 1.0x cat",
            ours["cpu_s_per_gb"] <= cat["cpu_s_per_gb"],
        ),
    ]
    if has_map_transform:
        sdk = s["meltano-map-transform"]
        ours_there = s["mapper-state (map-transform's sizes)"]
        out.append(
            Row(
                "throughput: meltano-map-transform (no-op stream maps), slope "
                + " -> ".join(_lines(n) for n in scale.map_transform_lines)
                + " lines"
                + ("" if sdk.get("slope", True) else " (no slope in the noise: the larger run)"),
                f"{sdk['mb_per_s']:,.1f} MB/s, {sdk['cpu_s_per_gb']:,.0f} s CPU/GB",
                f"mapper-state {ours_there['mb_per_s']:,.0f} MB/s on the same streams",
                f"mapper-state {ours['mb_per_s'] / sdk['mb_per_s']:,.0f}x faster",
                ">= 75x faster",
                ours["mb_per_s"] >= 75 * sdk["mb_per_s"],
            )
        )
    text = s["mapper-state, every record holds STATE"]
    text_between = " -> ".join(_lines(n) for n in scale.state_text_lines)
    out.append(
        Row(
            f'every record holds "STATE", slope {text_between} lines',
            f"{text['mb_per_s']:,.0f} MB/s, {text['cpu_s_per_gb']:.2f} s CPU/GB",
            f"plain stream {ours['mb_per_s']:,.0f} MB/s, {ours['cpu_s_per_gb']:.2f} s CPU/GB",
            f"{ours['mb_per_s'] / text['mb_per_s']:.2f}x slower than plain",
            "within 2x of plain",
            text["mb_per_s"] * 2 >= ours["mb_per_s"],
        )
    )
    by = {(r["contender"], r["stream"], r["lines"]): r for r in data["runs"]}
    for n in sorted(scale.shape_lines):
        m, c = by[("mapper-state", "plain", n)], by[("cat", "plain", n)]
        out.append(
            Row(
                f"plain stream of {_lines(n)} lines ({m['mb']:,.0f} MB), start-up included",
                f"{m['mb'] / m['wall_s']:,.0f} MB/s, {m['cpu_s'] / m['mb'] * 1000:.2f} s CPU/GB, "
                f"peak RSS {m['rss_mb']:.0f} MB",
                f"cat {c['mb'] / c['wall_s']:,.0f} MB/s, {c['cpu_s'] / c['mb'] * 1000:.2f} s CPU/GB",
                f"{c['wall_s'] / m['wall_s']:.2f}x cat",
                "",
            )
        )
    big = by[("mapper-state", "plain", large)]
    out.append(
        Row(
            f"peak RSS, {_lines(large)} lines",
            f"{big['rss_mb']:.1f} MB",
            f"cat {by[('cat', 'plain', large)]['rss_mb']:.1f} MB",
            "",
            "< 60 MB",
            big["rss_mb"] < 60,
        )
    )
    h, hc = by[("mapper-state", "huge-line", 1)], by[("cat", "huge-line", 1)]
    out.append(
        Row(
            f"one {scale.huge_line_mb} MB RECORD line: peak RSS",
            f"{h['rss_mb']:.1f} MB ({h['mb'] / h['wall_s']:,.0f} MB/s)",
            f"cat {hc['rss_mb']:.1f} MB ({hc['mb'] / hc['wall_s']:,.0f} MB/s)",
            "",
            "< 60 MB",
            h["rss_mb"] < 60,
        )
    )
    every = data["every_state"]["runs"]
    plain_mb_s = by[("mapper-state", "plain", scale.every_state_lines)]
    for interval, r in every.items():
        label = "default 5 s" if interval == "5" else "0 s: write whenever the last write is done"
        out.append(
            Row(
                f"a STATE after every record ({_lines(data['every_state']['lines'])} lines), "
                f"checkpoint interval {label}",
                f"{fmt_int(r['states'])} STATEs -> {fmt_int(r['commits'])} commits",
                f"{r['mb_per_s']:,.0f} MB/s (plain stream "
                f"{plain_mb_s['mb'] / plain_mb_s['wall_s']:,.0f} MB/s)",
                f"{r['states'] / max(r['commits'], 1):,.0f} STATEs per commit",
                "",
            )
        )
    slow = data["slow_store"]["mb_per_s"]
    out.append(
        Row(
            f"store taking 500 ms per request, a checkpoint after every state (slope {between})",
            f"{slow['500 ms store']:,.0f} MB/s",
            f"instant store {slow['instant store']:,.0f} MB/s",
            f"{slow['500 ms store'] / slow['instant store']:.2f}x the instant store",
            ">= 0.9x",
            slow["500 ms store"] >= 0.9 * slow["instant store"],
        )
    )
    st = data["startup"]
    out.append(
        Row(
            "start-up: mapper-state --version",
            fmt_ms(st["version_s"]),
            "imports " + (", ".join(st["heavy_modules_loaded"]) or "no cloud SDK"),
            "",
            "< 300 ms",
            st["version_s"] < 0.3,
        )
    )
    return out


def _lines(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return f"{n:,}"
