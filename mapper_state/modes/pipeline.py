"""``mapper-state run``: own the tap and the target, commit only what the target confirmed.

The tap's stdout is pumped into the target's stdin by the same byte pump as the
filter; the target's stdout (bare state values, one per line, each printed once
the target has safely written the data before it) is committed and echoed. The
tap gets the prior state through a private temp file. Signals are forwarded to
both children, which run in their own process groups so a terminal's Ctrl-C
reaches them once, through us; whatever ends the run, they and everything they started
are stopped before the lease is released, even if we are killed (:mod:`mapper_state.warden`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from mapper_state import jsonio, log, signals, warden
from mapper_state.core.session import RunHooks, Session
from mapper_state.errors import ConfigError, DownstreamClosed, ExitCode, MapperStateError
from mapper_state.modes import metrics, runlog
from mapper_state.settings import Settings
from mapper_state.stream.pump import CHUNK, LineScanner, enlarge_pipe, pump

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM if mapper-state dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def command_line(settings: Settings, name: str) -> list[str]:
    raw = settings.tap if name == "tap" else settings.target
    if not raw or not str(raw).strip():
        raise ConfigError(
            f"setting {name} is required for run (--{name} or MAPPER_STATE_{name.upper()})"
        )
    try:
        return shlex.split(raw)
    except ValueError as exc:
        raise ConfigError(f"setting {name} is not a valid command line: {exc}") from None


class LineCounter:
    """A scanner for the tap-to-target pump: counts messages (and records), parses nothing."""

    states = 0

    def __init__(self, count_records: bool = False) -> None:
        self.lines = 0
        self.records = 0
        self.bytes = 0
        self.count_records = count_records

    def feed(self, chunk: bytes | bytearray, end: int | None = None) -> None:
        end = len(chunk) if end is None else end
        self.lines += chunk.count(b"\n", 0, end)
        self.bytes += end
        if self.count_records:  # only for the progress line on a terminal, and for metrics
            self.records += metrics.count_records(chunk, end)

    def finish(self) -> None:
        pass


@dataclass
class Progress:
    """What the progress line and the final log report."""

    counter: LineCounter
    confirmed: int = 0
    started: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Outcome:
    """How the children ended: their exit codes (negative: killed by that signal)."""

    tap: int
    target: int
    target_closed: bool


def exit_name(code: int) -> str:
    """``0``, ``1``, or ``SIGTERM`` for a child killed by a signal (``-15``)."""
    if code >= 0:
        return str(code)
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(code)


@contextlib.contextmanager
def private_state_file(session: Session) -> Iterator[str | None]:
    """The prior state in a 0600 temp file for ``--state``, or ``None`` without one."""
    value = session.tap_state
    if value is None:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="mapper-state-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(jsonio.dumps(value))
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class Children:
    """The tap and target processes, and the signals we forward to them."""

    def __init__(self, tap: list[str], target: list[str]) -> None:
        self.received: int | None = None
        try:
            self.target = subprocess.Popen(
                target,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                process_group=0,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise MapperStateError(
                f"cannot start the target {target[0]}: {exc.strerror}",
                exit_code=ExitCode.TARGET_FAILED,
            ) from None
        try:
            self.tap = subprocess.Popen(
                tap, stdout=subprocess.PIPE, process_group=0, preexec_fn=_die_with_parent
            )
        except OSError as exc:
            self.target.kill()
            self.target.wait()
            raise MapperStateError(
                f"cannot start the tap {tap[0]}: {exc.strerror}", exit_code=ExitCode.TAP_FAILED
            ) from None

    def forward(self, signum: int, frame: object = None) -> None:
        self.received = self.received or signum
        for child in (self.tap, self.target):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    def stop_tap(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.tap.terminate()


def _confirmations(children: Children, session: Session, progress: Progress) -> threading.Thread:
    """Read the target's stdout: commit each state line and echo it to our stdout."""

    def on_state(value: object) -> None:
        progress.confirmed += 1
        session.offer(value)

    reported: set[str] = set()

    def on_bad(message: str) -> None:  # once each: a target echoing its input repeats them
        if message not in reported:
            reported.add(message)
            log.warning(message + " (further ones not reported)")

    def read() -> None:
        assert children.target.stdout is not None
        src = children.target.stdout.fileno()
        scanner = LineScanner(on_state, on_bad, after_target=True)
        echo = True
        while chunk := os.read(src, CHUNK):
            if echo:
                try:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                except (BrokenPipeError, ValueError):
                    echo = False
            scanner.feed(chunk)
        scanner.finish()

    thread = threading.Thread(target=read, name="target-confirmations", daemon=True)
    thread.start()
    return thread


def _progress_line(progress: Progress, session: Session) -> None:
    """Rewrite one status line on the terminal every second."""
    while not progress.stop.wait(1.0):
        elapsed = time.monotonic() - progress.started
        counter = progress.counter
        rate = counter.records / elapsed if elapsed else 0
        last = session.last_commit_at
        commit = f"last commit {time.time() - last:.0f}s ago" if last else "no commit yet"
        sys.stderr.write(
            f"\rmapper-state: {counter.records:,} records ({rate:,.0f}/s), "
            f"{counter.lines:,} messages, {progress.confirmed} states confirmed, {commit}   "
        )
        sys.stderr.flush()
    sys.stderr.write("\n")


def run_pipeline(settings: Settings, hooks: RunHooks | None = None) -> int:
    """Run tap | target under the lease; return the exit code (README, exit codes)."""
    tap_cmd, target_cmd = command_line(settings, "tap"), command_line(settings, "target")
    run_metrics = metrics.open_metrics(settings)
    run_log = runlog.RunLog(settings, "run")  # the run's record in the store
    return run_log.recorded(
        lambda: metrics.measured(
            run_metrics,
            lambda: _run_pipeline(settings, hooks, tap_cmd, target_cmd, run_metrics, run_log),
        )
    )


def _run_pipeline(
    settings: Settings,
    hooks: RunHooks | None,
    tap_cmd: list[str],
    target_cmd: list[str],
    run_metrics: metrics.RunMetrics | None,
    run_log: runlog.RunLog,
) -> int:
    session = Session(settings, store=run_log.store_for_session(), hooks=hooks)
    if run_metrics is not None:
        run_metrics.session = session  # the lease wait counts even if it fails
    with (
        # SIGTERM before the children run still releases the lease; a lost lease stops all
        signals.raising(wake=session.check),
        contextlib.ExitStack() as leased,
        private_state_file(run_log.enter(session, leased)) as state_path,
        warden.guarding(),  # nothing the run started outlives its lease, even if we are killed
    ):
        if state_path:
            tap_cmd = [*tap_cmd, "--state", state_path]
        children = Children(tap_cmd, target_cmd)
        progress = _start_progress(settings, session, run_metrics)
        run_log.counts = lambda: runlog.Counts(
            progress.counter.records if progress.counter.count_records else None,
            progress.counter.bytes,
            progress.confirmed,
        )
        outcome = _supervise(children, session, progress)
        session.finish()  # the last target-confirmed state; raises if the lease was lost
        log.info(
            "run finished",
            state_id=session.state_id,
            messages=progress.counter.lines,
            states_confirmed=progress.confirmed,
            tap_exit=exit_name(outcome.tap),
            target_exit=exit_name(outcome.target),
        )
    return _verdict(children.received, outcome, progress.confirmed)


def _start_progress(
    settings: Settings, session: Session, run_metrics: metrics.RunMetrics | None
) -> Progress:
    """The run's counters, wired to the metrics, and the terminal's progress line if any."""
    show_progress = sys.stderr.isatty() and settings.log_format == "text"
    counted = show_progress or run_metrics is not None  # records: a scan of every chunk
    progress = Progress(LineCounter(count_records=counted))
    if run_metrics is not None:
        run_metrics.bytes = lambda: progress.counter.bytes
        run_metrics.records = lambda: progress.counter.records
        run_metrics.states = lambda: progress.confirmed
        metrics.attach(run_metrics, session)
    if show_progress:
        threading.Thread(target=_progress_line, args=(progress, session), daemon=True).start()
    return progress


def _supervise(children: Children, session: Session, progress: Progress) -> Outcome:
    """Pump the tap into the target, read its confirmations, and wait for both to end."""
    previous = {s: signal.signal(s, children.forward) for s in (signal.SIGINT, signal.SIGTERM)}
    reader = _confirmations(children, session, progress)
    target_closed = False
    try:
        assert children.tap.stdout is not None
        assert children.target.stdin is not None
        enlarge_pipe(children.target.stdin.fileno())
        try:
            pump(
                children.tap.stdout.fileno(),
                children.target.stdin.fileno(),
                progress.counter,  # type: ignore[arg-type]
                check=session.check,
            )
        except DownstreamClosed:
            target_closed = True
            children.stop_tap()
        finally:
            with contextlib.suppress(BrokenPipeError):
                children.target.stdin.close()
            children.tap.stdout.close()
        outcome = Outcome(
            signals.wait_process(children.tap),
            signals.wait_process(children.target),
            target_closed,
        )
        reader.join()
    finally:
        progress.stop.set()
        for s, h in previous.items():
            signal.signal(s, h)
        if children.tap.poll() is None or children.target.poll() is None:
            children.forward(signal.SIGTERM)
            children.tap.wait()
            children.target.wait()
    return outcome


def _verdict(received: int | None, outcome: Outcome, confirmed: int) -> int:
    """The exit code, with one line saying what failed and what was stored."""
    kept = "the stored state is unchanged"
    if received:
        stored = "stored the last state the target confirmed" if confirmed else kept
        log.error(f"interrupted by {signal.Signals(received).name}; {stored}")
        return 128 + received
    if outcome.target != 0 or outcome.target_closed:
        stored = "stored the last state it confirmed" if confirmed else f"it confirmed none: {kept}"
        log.error(f"the target failed (exit {exit_name(outcome.target)}); {stored}")
        return ExitCode.TARGET_FAILED
    if outcome.tap != 0:
        stored = (
            "stored the last state the target confirmed"
            if confirmed
            else f"the target confirmed none: {kept}"
        )
        log.error(f"the tap failed (exit {exit_name(outcome.tap)}); {stored}")
        return ExitCode.TAP_FAILED
    return ExitCode.OK
