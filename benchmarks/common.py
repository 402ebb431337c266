"""What every benchmark shares: where the tools are, how big a run is, how a child is measured.

A measurement is a :class:`Usage`: wall seconds, user+system CPU seconds and peak RSS of
a child process *and every descendant it waited for* (``wait4``'s resource usage), so a
shell pipeline, ``mapper-state run`` and ``meltano run`` are each charged for their tap
and target too. Each benchmark module returns a :class:`Section`: its Markdown rows,
its raw figures (written to ``results/<name>.json``) and the pictures it asks for.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from tests.support.processes import popen

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MAPPER = str(BIN / "mapper-state")
TAP_SAMPLE = str(BIN / "tap-sample")
TOOLS = Path(os.environ.get("MAPPER_STATE_TOOLS_DIR", ROOT / ".tools"))
MELTANO = str(TOOLS / "meltano" / "bin" / "meltano")
TARGET_JSONL = str(TOOLS / "target-jsonl" / "bin" / "target-jsonl")
MAP_TRANSFORM = str(TOOLS / "meltano-map-transform" / "bin" / "meltano-map-transform")
GENERATE_DATA = ROOT / "examples" / "generate_data.py"
INSTALL_HINT = "make setup tools (scripts/install-tools.sh)"


class BenchError(RuntimeError):
    """A benchmark could not measure what it promised (a tool failed or is missing)."""


def require(*paths: str) -> None:
    """Fail at once, with the command that installs it, when a tool is missing."""
    missing = [p for p in paths if not os.access(p, os.X_OK)]
    if missing:
        raise BenchError(f"not installed: {', '.join(missing)}: run {INSTALL_HINT}")


# -- how big a run is ------------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Every size the benchmarks use; ``DEFAULT`` is ``make bench``, ``TINY`` the smoke test."""

    name: str
    repeats: int
    slope_lines: tuple[int, int]  # the two stream sizes whose difference gives the slope
    shape_lines: tuple[int, ...]  # plain streams also reported one by one
    state_text_lines: tuple[int, int]  # slope sizes of the stream whose every record holds STATE
    huge_line_mb: int  # one RECORD line this many MB long
    every_state_lines: int  # a stream with a STATE after every record
    map_transform_lines: tuple[int, int]  # the slow SDK mapper's own slope sizes
    pipeline_records: int  # tap-sample -> target-jsonl
    handover_repeats: int
    operator_ids: tuple[int, ...]  # state IDs in the bucket, one bucket each
    operator_history: int  # history snapshots per state ID in those buckets
    history_ids: int  # state IDs of the buckets that vary the history length
    history_lengths: tuple[int, ...]
    fleet_pipelines: int
    fleet_replicas: int
    requests_records: int  # the requests-per-run scenarios' stream
    requests_state_every: int
    backend_list_ids: int  # state IDs listed by `meltano state list`, each backend
    race_writers: int  # concurrent `meltano state merge` per round of the backends' race
    watch_pipelines: int  # state IDs scraped by `metrics serve`
    watch_runs: int  # run records per state ID in that bucket


DEFAULT = Scale(
    name="default",
    repeats=3,
    slope_lines=(1_000_000, 5_000_000),
    shape_lines=(100_000, 1_000_000),
    state_text_lines=(100_000, 1_000_000),
    huge_line_mb=200,
    every_state_lines=1_000_000,
    map_transform_lines=(100_000, 300_000),
    pipeline_records=100_000,
    handover_repeats=6,
    operator_ids=(100, 1_000, 5_000),
    operator_history=3,
    history_ids=1_000,
    history_lengths=(0, 3, 10),
    fleet_pipelines=50,
    fleet_replicas=4,
    requests_records=1_000,
    requests_state_every=100,
    backend_list_ids=5_000,
    race_writers=8,
    watch_pipelines=5_000,
    watch_runs=10,
)

TINY = Scale(
    name="tiny",
    repeats=1,
    slope_lines=(2_000, 6_000),
    shape_lines=(1_000, 2_000),
    state_text_lines=(1_000, 3_000),
    huge_line_mb=2,
    every_state_lines=2_000,
    map_transform_lines=(500, 1_500),
    pipeline_records=200,
    handover_repeats=1,
    operator_ids=(3, 6),
    operator_history=2,
    history_ids=3,
    history_lengths=(0, 2, 4),
    fleet_pipelines=3,
    fleet_replicas=2,
    requests_records=100,
    requests_state_every=20,
    backend_list_ids=50,
    race_writers=2,
    watch_pipelines=20,
    watch_runs=3,
)

SCALES = {s.name: s for s in (DEFAULT, TINY)}
TEN_MILLION = 10_000_000


def with_ten_million(scale: Scale) -> Scale:
    """The same run with a 10M-line stream among the stream shapes (``--ten-million``)."""
    return replace(scale, shape_lines=(*scale.shape_lines, TEN_MILLION))


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of a scoreboard table."""

    measure: str
    value: str
    reference: str = ""  # the same measure for what a user would pick instead
    ratio: str = ""  # the figure the goal is about
    goal: str = ""
    met: bool | None = None  # None: no goal

    def cells(self) -> list[str]:
        verdict = "" if self.met is None else ("yes" if self.met else "**no**")
        return [self.measure, self.value, self.reference, self.ratio, self.goal, verdict]


@dataclass
class Section:
    """What one benchmark measured."""

    name: str  # results/<name>.json
    title: str
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


# -- the environment -------------------------------------------------------------------

_FOREIGN = ("MAPPER_STATE_", "MELTANO_", "AWS_", "AZURE_", "GOOGLE_", "TAP_", "TARGET_")


def clean_env(work: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any settings of ours, Meltano's or a cloud's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    missing = str(work / "no-aws-config")
    env.update(
        AWS_CONFIG_FILE=missing,
        AWS_SHARED_CREDENTIALS_FILE=missing,
        AWS_EC2_METADATA_DISABLED="true",
        MELTANO_SEND_ANONYMOUS_USAGE_STATS="false",
        MELTANO_CLI_DISABLE_VERSION_CHECK="true",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A scratch directory, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"mapper-state-bench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- measuring children ----------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """A finished child: wall seconds, CPU seconds (user + system) and peak RSS in MB."""

    wall: float
    cpu: float
    rss_mb: float

    @staticmethod
    def best(runs: Sequence[Usage]) -> Usage:
        """Best of several runs of the same thing: least time, least CPU, most memory."""
        return Usage(
            min(r.wall for r in runs), min(r.cpu for r in runs), max(r.rss_mb for r in runs)
        )

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall, "cpu_s": self.cpu, "rss_mb": self.rss_mb}


def wait_usage(proc: subprocess.Popen[Any], timeout: float) -> tuple[int, float, float]:
    """Wait for ``proc``; its exit code, CPU seconds and peak RSS (MB) with its children's.

    A child still running after ``timeout`` seconds is killed with its process group.
    """
    timer = threading.Timer(timeout, _kill_group, args=(proc.pid,))
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_measured(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    timeout: float = 600,
    ok: tuple[int, ...] = (0,),
) -> Usage:
    """Run ``args`` to the end in its own process group and measure it; fail on a bad exit."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = popen(  # in a session of its own, and killed if the benchmark dies first
            args,
            cwd=cwd,
            env=dict(env),
            stdin=stdin,
            stdout=stdout,
            stderr=err,
            start_new_session=True,
        )
        code, cpu, rss = wait_usage(proc, timeout)
        wall = time.perf_counter() - started
        if code not in ok:
            err.seek(0)
            raise BenchError(f"{_shown(args)} exited {code}:\n{_tail(err.read())}")
    return Usage(wall, cpu, rss)


def _shown(args: Sequence[str]) -> str:
    text = " ".join(str(a) for a in args)
    return text if len(text) < 200 else text[:200] + "..."


def _tail(data: bytes, limit: int = 3000) -> str:
    return data.decode(errors="replace")[-limit:]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


DONE_LINE = re.compile(rb"done \(state_id=\S+ bytes=(\d+) states=(\d+) commits=(\d+)\)")


def done_counts(stderr: bytes) -> tuple[int, int]:
    """The STATE messages seen and the commits made, from mapper-state's last log line."""
    found = DONE_LINE.findall(stderr)
    if not found:
        raise BenchError(f"mapper-state printed no 'done' line:\n{_tail(stderr)}")
    _, states, commits = found[-1]
    return int(states), int(commits)


# -- a throw-away Meltano project ------------------------------------------------------


def meltano_project(work: Path, rows: int) -> Path:
    """A copy of this repository's meltano.yml in ``work``, its plugins linked in, ``rows`` rows.

    The plugins' executables in meltano.yml are relative to the project root, so linking
    ``.venv`` and ``.tools`` in is all it takes to run offline, with no ``meltano install``.
    """
    require(MELTANO, TARGET_JSONL, TAP_SAMPLE)
    project = work / "meltano-project"
    (project / "examples" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "meltano.yml", project / "meltano.yml")
    (project / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    (project / ".tools").symlink_to(TOOLS, target_is_directory=True)
    generate_rows(project / "examples" / "data" / "events.jsonl", rows)
    return project


def generate_rows(path: Path, rows: int) -> None:
    """tap-sample's data file with ``rows`` rows (the demo's generator, a fixed seed)."""
    args = ["--rows", str(rows), "--seed", "1", "--reset", "--quiet", "--file", str(path)]
    subprocess.run([sys.executable, str(GENERATE_DATA), *args], check=True)


def fmt_int(n: float) -> str:
    return f"{n:,.0f}"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"
