"""The filter: ``tap | mapper-state --state-id ID | target`` (and ``--after-target``).

Takes the lease, hands the prior state to the tap, pumps stdin to stdout while
committing the STATE messages it sees, writes the last one, releases the lease.
Signals and a broken downstream pipe end the run with the lease released and,
for a broken pipe, nothing written after the last commit.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from mapper_state import handoff, log
from mapper_state.config import Settings
from mapper_state.errors import BadInput, DownstreamClosed, ExitCode, Interrupted
from mapper_state.pump import LineScanner, pump
from mapper_state.session import Session


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT/SIGTERM raise :class:`Interrupted` in the main thread, so cleanup runs."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _on_bad(strict: bool):  # type: ignore[no-untyped-def]
    def on_bad(message: str) -> None:
        if strict:
            raise BadInput(message + " (--strict)")
        log.warning(message)

    return on_bad


def run_filter(
    settings: Settings,
    *,
    state_file: str | None = None,
    after_target: bool = False,
    input_path: str | None = None,
) -> int:
    """Run the filter to the end of its input; return the exit code."""
    with signals_raise():
        session = Session(settings)
        try:
            session.__enter__()
        except BaseException:
            if state_file:
                handoff.release_reader(state_file)
            raise
        writer = None
        try:
            if state_file:
                writer = handoff.hand_off(state_file, session.handoff_value)
            src = os.open(input_path, os.O_RDONLY) if input_path else sys.stdin.fileno()
            scanner = LineScanner(session.offer, _on_bad(bool(settings["strict"])), after_target)
            try:
                stats = pump(src, sys.stdout.fileno(), scanner, check=session.check)
            finally:
                if input_path:
                    os.close(src)
            wrote = session.finish()
            log.info(
                "done",
                state_id=session.state_id,
                bytes=stats.bytes,
                states=stats.states,
                committed="yes" if wrote or session.checkpointer.commits else "no",  # type: ignore[union-attr]
            )
            return ExitCode.OK
        except DownstreamClosed:
            log.error("the target closed its input; states after the last commit are not stored")
            return ExitCode.DOWNSTREAM_CLOSED
        except FileNotFoundError as exc:
            log.error(f"--input {exc.filename}: no such file")
            return ExitCode.CONFIG
        finally:
            if writer is not None:
                writer.stop()
            session.__exit__(None, None, None)
