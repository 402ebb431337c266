"""Benchmarks of SPEC section 5, each as a ratio against a reference run side by side.

* throughput: ``cat FILE | X | cat >/dev/null`` with X = ``cat`` and X = ``mapper-state``,
  on a 1M-line and a 5M-line stream of ~200-byte records with a STATE every 10,000
  lines; the slope between the two sizes cancels start-up out;
* peak RSS of mapper-state on the 5M-line stream;
* start-up: ``mapper-state --version`` and whether any cloud SDK was imported;
* a store that takes 500 ms per request leaves throughput unchanged;
* the Singer SDK's no-op mapper ``meltano-map-transform``, when installed under
  ``.tools/``, on the same arrangement (a smaller stream: it is slow).

Run with ``make bench``; results print as a Markdown table and go to
``benchmarks/results/latest.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPER = str(Path(sys.executable).parent / "mapper-state")
MAP_TRANSFORM = ROOT / ".tools" / "meltano-map-transform" / "bin" / "meltano-map-transform"
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
SIZES = (1_000_000, 5_000_000)


def generate(path: Path, lines: int) -> None:
    """A Singer stream of ~200-byte RECORD lines with a STATE every 10,000 lines."""
    pad = "x" * 96
    with path.open("w") as f:
        f.write(
            '{"type":"SCHEMA","stream":"events","schema":{"type":"object"},"key_properties":["id"]}\n'
        )
        for i in range(1, lines):
            if i % 10_000 == 0:
                f.write(
                    '{"type":"STATE","value":{"bookmarks":{"events":'
                    f'{{"replication_key":"updated_at","replication_key_value":{i}}}}}}}}}\n'
                )
            else:
                f.write(
                    f'{{"type":"RECORD","stream":"events","record":{{"id":{i},"name":"{pad}",'
                    f'"updated_at":"2024-01-01T00:00:00Z"}},"time_extracted":"2024-01-01T00:00:00Z"}}\n'
                )


def timed_pipeline(
    src: Path, middle: list[str], cwd: Path, env: dict[str, str]
) -> tuple[float, int]:
    """Seconds for ``cat src | middle | cat >/dev/null`` and the middle's peak RSS (KiB)."""
    started = time.perf_counter()
    head = subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE)
    mid = subprocess.Popen(
        middle,
        stdin=head.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
    )
    assert head.stdout is not None and mid.stdout is not None
    head.stdout.close()
    tail = subprocess.Popen(["cat"], stdin=mid.stdout, stdout=subprocess.DEVNULL)
    mid.stdout.close()
    _, status, usage = os.wait4(mid.pid, 0)
    mid.returncode = os.waitstatus_to_exitcode(status)
    head.wait()
    tail.wait()
    elapsed = time.perf_counter() - started
    if mid.returncode != 0:
        raise SystemExit(f"{middle[0]} exited {mid.returncode}")
    return elapsed, usage.ru_maxrss


LAST_BYTE = """
import os, sys, time
expected, remaining = int(sys.argv[1]), int(sys.argv[1])
while remaining > 0:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    remaining -= len(chunk)
print(time.time())
while os.read(0, 1 << 20):
    pass
"""


def time_to_last_byte(src: Path, middle: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Seconds until the downstream reader has every byte (excludes the final commit)."""
    started = time.time()
    with src.open("rb") as stdin:
        mid = subprocess.Popen(
            middle, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, env=env
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


def best(src: Path, middle: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    runs = [timed_pipeline(src, middle, cwd, env) for _ in range(REPEATS)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def startup(env: dict[str, str]) -> tuple[float, list[str]]:
    times = []
    for _ in range(10):
        started = time.perf_counter()
        subprocess.run([MAPPER, "--version"], check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - started)
    probe = (
        "import sys; sys.argv=['mapper-state','--version']\n"
        "from mapper_state.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('loaded:' + ','.join(m for m in ('boto3', 'botocore', 'azure', 'google',"
        " 'singer_sdk') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    line = next(x for x in out.stdout.splitlines() if x.startswith("loaded:"))
    loaded = [m for m in line.removeprefix("loaded:").split(",") if m]
    return min(times), loaded


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mapper-state-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAPPER_STATE_", "MELTANO_"))}
    env["MAPPER_STATE_HISTORY_KEEP"] = "0"
    rows: list[tuple[str, str, str]] = []
    try:
        files = {}
        for n in SIZES:
            files[n] = work / f"stream-{n}.jsonl"
            generate(files[n], n)
        results: dict[tuple[str, int], tuple[float, int]] = {}
        for n in SIZES:
            for name, cmd in (
                ("cat", ["cat"]),
                ("mapper-state", [MAPPER, "--state-id", "bench"]),
                (
                    "mapper-state, 500 ms store",
                    [
                        MAPPER,
                        "--state-id",
                        "bench",
                        "--checkpoint-interval-seconds",
                        "0",
                        "--state-backend-uri",
                        "memory://bench?latency_ms=500",
                    ],
                ),
            ):
                results[(name, n)] = best(files[n], cmd, work, env)
        small, large = SIZES
        mb = {n: files[n].stat().st_size / 1e6 for n in SIZES}

        def slope_rate(name: str) -> float:  # MB/s between the two sizes
            dt = results[(name, large)][0] - results[(name, small)][0]
            return (mb[large] - mb[small]) / dt

        cat_rate = slope_rate("cat")
        for name in ("cat", "mapper-state"):
            rate = slope_rate(name)
            rows.append((f"throughput: {name}", f"{rate:,.0f} MB/s", f"{rate / cat_rate:.2f}x cat"))
        fast = [
            MAPPER,
            "--state-id",
            "bench",
            "--checkpoint-interval-seconds",
            "0",
            "--state-backend-uri",
            "memory://bench",
        ]
        slow = [*fast[:-1], "memory://bench?latency_ms=500"]
        streaming = {}
        for name, cmd in (("fast store", fast), ("500 ms store", slow)):
            times = {
                n: min(time_to_last_byte(files[n], cmd, work, env) for _ in range(REPEATS))
                for n in SIZES
            }
            streaming[name] = (mb[large] - mb[small]) / (times[large] - times[small])
        rows.append(
            (
                "throughput with a store taking 500 ms per request (checkpoint every state)",
                f"{streaming['500 ms store']:,.0f} MB/s",
                f"{streaming['500 ms store'] / streaming['fast store']:.2f}x the same with an instant store",
            )
        )
        rss = results[("mapper-state", large)][1] / 1024
        rows.append(("peak RSS, mapper-state, 5M lines", f"{rss:.1f} MB", "goal < 60 MB"))
        seconds, loaded = startup(env)
        rows.append(
            ("start-up: mapper-state --version", f"{seconds * 1000:.0f} ms", "goal < 300 ms")
        )
        rows.append(("modules imported by --version", ", ".join(loaded) or "no cloud SDK", ""))
        if MAP_TRANSFORM.exists():  # installed by scripts/install-tools.sh
            # the SDK's no-op mapper is slow: a 100k- and a 300k-line stream, same slope method
            sample = {n: work / f"stream-{n}.jsonl" for n in (100_000, 300_000)}
            for n, path in sample.items():
                generate(path, n)
            config = work / "map.json"
            config.write_text(json.dumps({"stream_maps": {}}))
            theirs = [str(MAP_TRANSFORM), "--config", str(config)]
            t = {n: best(path, theirs, work, env)[0] for n, path in sample.items()}
            size = {n: path.stat().st_size / 1e6 for n, path in sample.items()}
            rate = {
                "meltano-map-transform": (size[300_000] - size[100_000])
                / (t[300_000] - t[100_000]),
                "cat": cat_rate,
                "mapper-state": slope_rate("mapper-state"),
            }
            rows.append(
                (
                    "throughput: meltano-map-transform (no-op stream maps)",
                    f"{rate['meltano-map-transform']:,.1f} MB/s",
                    f"{rate['meltano-map-transform'] / rate['cat']:.4f}x cat; mapper-state is "
                    f"{rate['mapper-state'] / rate['meltano-map-transform']:.0f}x faster",
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = ["| measure | value | ratio / goal |", "|---|---|---|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    text = "\n".join(table)
    print(text)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.md").write_text(text + "\n")
    # Requests per run to an S3 store, against Meltano's S3 backend (its own table).
    print()
    subprocess.run([sys.executable, str(Path(__file__).with_name("requests.py"))], check=True)


if __name__ == "__main__":
    main()
