"""The filter: ``tap | mapper-state --state-id ID | target`` (and ``--after-target``).

Takes the lease, hands the prior state to the tap, pumps stdin to stdout while
committing the STATE messages it sees, writes the last one, releases the lease.
Signals and a broken downstream pipe end the run with the lease released and,
for a broken pipe, nothing written after the last commit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from mapper_state import log, signals
from mapper_state.core.session import RunHooks, Session
from mapper_state.errors import BadInput, ConfigError, DownstreamClosed, ExitCode, Interrupted
from mapper_state.modes import metrics, runlog
from mapper_state.settings import Settings
from mapper_state.stream import handoff
from mapper_state.stream.pump import LineScanner, pump


def _on_bad(strict: bool) -> Callable[[str], None]:
    def on_bad(message: str) -> None:
        if strict:
            raise BadInput(message + " (--strict)")
        log.warning(message)

    return on_bad


def release_tap(state_file: str | None) -> None:
    """The filter will not start: let a tap waiting on ``state_file`` (a pipe) see its end
    and fail, rather than wait for a state that never comes."""
    if state_file:
        handoff.release_reader(state_file)


def run_filter(
    settings: Settings,
    *,
    state_file: str | None = None,
    hooks: RunHooks | None = None,
    after_target: bool = False,
    input_path: str | None = None,
) -> int:
    """Run the filter to the end of its input; return the exit code."""
    try:
        run_metrics = metrics.open_metrics(settings)
    except ConfigError:
        release_tap(state_file)
        raise
    run_log = runlog.RunLog(settings, "filter")  # the run's record in the store
    return run_log.recorded(
        lambda: metrics.measured(
            run_metrics,
            lambda: _run_filter(
                settings,
                state_file=state_file,
                hooks=hooks,
                after_target=after_target,
                input_path=input_path,
                run_metrics=run_metrics,
                run_log=run_log,
            ),
        )
    )


def _run_filter(
    settings: Settings,
    *,
    state_file: str | None,
    hooks: RunHooks | None,
    after_target: bool,
    input_path: str | None,
    run_metrics: metrics.RunMetrics | None,
    run_log: runlog.RunLog,
) -> int:
    with contextlib.ExitStack() as stack:
        src = _open_input(input_path, stack)
        session: Session | None = None
        stack.enter_context(signals.raising(wake=lambda: session.check() if session else None))
        session = _start_session(settings, hooks, state_file, run_metrics, stack, run_log)
        try:
            writer = handoff.hand_off(state_file, session.handoff_value) if state_file else None
            if writer is not None:  # stopped before the session ends
                stack.callback(writer.stop)
            scanner = _scanner(session, settings.strict, after_target, run_metrics, run_log)
            stats = pump(
                src, sys.stdout.fileno(), scanner, check=session.check, scan_first=after_target
            )
            session.finish()
        except Interrupted:
            if after_target:
                # every line read here is a state the target confirmed: commit the newest
                # (before the target, a state not yet committed is dropped: at-least-once)
                session.finish()
            raise
        except DownstreamClosed:
            log.error("the target closed its input; states after the last commit are not stored")
            return ExitCode.DOWNSTREAM_CLOSED
        log.info(
            "done",
            state_id=session.state_id,
            bytes=stats.bytes,
            states=stats.states,
            commits=session.commits,
        )
        return ExitCode.OK


def _open_input(input_path: str | None, stack: contextlib.ExitStack) -> int:
    """The descriptor to read: ``--input``'s file (closed with ``stack``) or stdin."""
    if not input_path:
        return sys.stdin.fileno()
    try:
        src = os.open(input_path, os.O_RDONLY)
    except OSError as exc:
        raise ConfigError(f"--input {input_path}: {exc.strerror}") from None
    stack.callback(os.close, src)
    return src


def _start_session(
    settings: Settings,
    hooks: RunHooks | None,
    state_file: str | None,
    run_metrics: metrics.RunMetrics | None,
    stack: contextlib.ExitStack,
    run_log: runlog.RunLog,
) -> Session:
    """The run's session, entered on ``stack``; if it cannot start, the tap's reader of
    ``state_file`` is let go so that the tap does not wait for a state that never comes."""
    try:
        session = Session(settings, store=run_log.store_for_session(), hooks=hooks)
        if run_metrics is not None:
            run_metrics.session = session  # the lease wait counts even if it fails
        return run_log.enter(session, stack)
    except BaseException:
        release_tap(state_file)
        raise


def _scanner(
    session: Session,
    strict: bool,
    after_target: bool,
    run_metrics: metrics.RunMetrics | None,
    run_log: runlog.RunLog,
) -> LineScanner:
    """What reads the stream's lines: committing states, and counting for the metrics and
    the run's record."""
    on_bad = _on_bad(strict)
    counted = run_metrics is not None  # records only for metrics: a scan of every chunk
    counting = metrics.CountingScanner(session.offer, on_bad, after_target, counted)
    run_log.counts = lambda: runlog.Counts(
        counting.records if counted else None, counting.bytes, counting.states
    )
    if run_metrics is None:
        return counting
    run_metrics.bytes = lambda: counting.bytes
    run_metrics.records = lambda: counting.records
    run_metrics.states = lambda: counting.states
    metrics.attach(run_metrics, session)
    return counting
