"""Run metrics in Prometheus text format, for node_exporter's textfile collector.

With ``--metrics-file PATH`` (the ``metrics_file`` setting) the filter and ``run``
write, labelled by state ID: records and bytes passed, STATE messages seen (for
``run``, the states the target confirmed), state writes, refused commits, the last
commit's time, the time spent waiting for the lease, the run's duration, whether it
is still running and, at exit, its exit code. The file is rewritten atomically
(``prometheus_client.write_to_textfile``: a temporary file renamed over it) after the
lease is taken, at each commit and at exit, so the collector never reads half a file.
``prometheus_client`` is imported only when a metrics file is asked for, so a run
without one (and ``mapper-state --version``) does not pay for it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from mapper_state import log
from mapper_state.core.recorder import exit_code_of
from mapper_state.core.session import Session
from mapper_state.errors import ConfigError
from mapper_state.settings import Settings
from mapper_state.stream.pump import LineScanner, OnBad, OnState

PREFIX = "mapper_state_"
_RECORD_TOKENS = (b'"type":"RECORD"', b'"type": "RECORD"')


def count_records(chunk: bytes | bytearray, end: int) -> int:
    """RECORD messages in ``chunk[:end]``, by their ``"type"`` (as taps write it, spaced or not)."""
    return sum(chunk.count(token, 0, end) for token in _RECORD_TOKENS)


class RunMetrics:
    """One run's metrics; the mode wires in where its numbers come from."""

    def __init__(self, path: str, state_id: str) -> None:
        self.path = path
        self.state_id = state_id
        self.started = time.time()
        self._started_monotonic = time.monotonic()
        self.session: Session | None = None
        self.bytes: Callable[[], int] = lambda: 0
        self.records: Callable[[], int] = lambda: 0
        self.states: Callable[[], int] = lambda: 0
        self.exit_code: int | None = None
        self._lock = threading.Lock()
        self._failed = False

    def _families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        session = self.session
        label = [self.state_id]

        def family(kind: type[Any], name: str, doc: str, value: float) -> Any:
            metric = kind(PREFIX + name, doc, labels=["state_id"])
            metric.add_metric(label, value)
            return metric

        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        yield family(counter, "records", "RECORD messages passed through.", self.records())
        yield family(counter, "bytes", "Bytes passed through.", self.bytes())
        yield family(
            counter,
            "states",
            "STATE messages seen (run: states the target confirmed).",
            self.states(),
        )
        yield family(counter, "commits", "State writes.", session.writes if session else 0)
        yield family(
            counter,
            "commits_refused",
            "Commits the guard refused (a state without bookmarks over one with bookmarks).",
            session.guard.refused if session else 0,
        )
        last = session.last_commit_at if session else None
        if last is not None:
            yield family(
                gauge, "last_commit_timestamp_seconds", "When the last state was written.", last
            )
        yield family(
            gauge,
            "lease_wait_seconds",
            "Time spent taking the lease (waiting for a busy one included).",
            session.lease_wait_seconds if session else 0.0,
        )
        yield family(gauge, "run_start_timestamp_seconds", "When the run started.", self.started)
        yield family(
            gauge,
            "run_duration_seconds",
            "How long the run has taken so far (at exit: in all).",
            time.monotonic() - self._started_monotonic,
        )
        yield family(
            gauge,
            "running",
            "1 while the run goes on, 0 once it ended.",
            0 if self.exit_code is not None else 1,
        )
        if self.exit_code is not None:
            yield family(
                gauge, "exit_code", "The run's exit code (see the README).", self.exit_code
            )

    def write(self) -> None:
        """Rewrite the file atomically; a failure is a warning (once), never the run's end."""
        from prometheus_client import CollectorRegistry, write_to_textfile

        metrics = self

        class Collector:
            def collect(self) -> Iterator[Any]:
                return metrics._families()

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        with self._lock:
            try:
                write_to_textfile(self.path, registry)
            except OSError as exc:
                if not self._failed:
                    log.warning(f"could not write the metrics file {self.path}: {exc.strerror}")
                self._failed = True

    def on_commit(self) -> None:
        self.write()


def open_metrics(settings: Settings) -> RunMetrics | None:
    """The run's metrics when ``metrics_file`` is set; its folder must exist."""
    path = settings.metrics_file
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"setting metrics_file: the folder {folder} does not exist")
    return RunMetrics(path, settings.state_id or "")


def measured(metrics: RunMetrics | None, run: Callable[[], int]) -> int:
    """Run ``run`` and return its exit code; with metrics, write them at exit with that code
    (or the code an exception ends the run with)."""
    if metrics is None:
        return run()
    try:
        code = run()
    except BaseException as exc:
        metrics.exit_code = exit_code_of(exc)
        metrics.write()
        raise
    metrics.exit_code = code
    metrics.write()
    return code


def attach(metrics: RunMetrics | None, session: Session) -> None:
    """Count the session's commits and write the metrics after each one, and now."""
    if metrics is None:
        return
    metrics.session = session
    session.on_commit = metrics.on_commit
    metrics.write()


class CountingScanner(LineScanner):
    """The filter's scanner, counting the bytes and (with ``count_records``, as metrics do:
    a scan of every chunk) the RECORD messages it is fed."""

    def __init__(
        self,
        on_state: OnState,
        on_bad: OnBad,
        after_target: bool = False,
        count_records: bool = True,
    ) -> None:
        super().__init__(on_state, on_bad, after_target)
        self.bytes = 0
        self.records = 0
        self.count_records = count_records

    def feed(self, chunk: bytes | bytearray, end: int | None = None) -> None:
        end = len(chunk) if end is None else end
        self.bytes += end
        if self.count_records:
            self.records += count_records(chunk, end)
        super().feed(chunk, end)
