"""Fleet metrics in Prometheus text format: ``mapper-state metrics`` and ``metrics serve``.

Every series is labelled ``state_id``; the store is looked at by
:class:`~mapper_state.ops.watch.FleetWatch` (its request cost is stated there). Labels hold
only state IDs, run IDs, host names and outcomes: never a command line, a URI or a setting,
so no secret reaches Prometheus. ``metrics serve`` answers scrapes over HTTP, bound to
127.0.0.1 unless told otherwise, GET only (``/metrics``; ``/healthz`` for a probe); a scrape within ``cache_seconds`` of the previous
look at the store is answered from that look, so Prometheus servers scraping in quick
succession (an HA pair, a restart) cost the store nothing more.

``prometheus_client`` is imported here only, when fleet metrics are asked for.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mapper_state import log
from mapper_state.core import runs
from mapper_state.errors import ConfigError
from mapper_state.ops.fleet import parse_duration
from mapper_state.ops.watch import FleetWatch, Watched

PREFIX = "mapper_state_"
#: The staleness bound of a pipeline no ``--max-age GLOB=DURATION`` names.
DEFAULT_MAX_AGE = 36 * 3600.0
#: A scrape this soon after the previous look at the store is answered from it.
CACHE_SECONDS = 10.0
DEFAULT_LISTEN = "127.0.0.1:9478"


@dataclass(frozen=True)
class MaxAges:
    """Each pipeline's staleness bound: the first matching ``GLOB=DURATION``, else the default."""

    rules: tuple[tuple[str, float], ...] = ()
    default: float = DEFAULT_MAX_AGE

    @classmethod
    def parse(cls, given: Sequence[str]) -> MaxAges:
        rules: list[tuple[str, float]] = []
        default = DEFAULT_MAX_AGE
        for text in given:
            glob, sep, duration = text.rpartition("=")
            if not sep:
                default = parse_duration(text)
            elif not glob:
                raise ConfigError(f"--max-age {text!r}: give GLOB=DURATION or DURATION")
            else:
                rules.append((glob, parse_duration(duration)))
        return cls(tuple(rules), default)

    def of(self, state_id: str) -> float:
        return next((s for g, s in self.rules if fnmatch.fnmatchcase(state_id, g)), self.default)


def families(pipelines: list[Watched], max_ages: MaxAges, now: float) -> Iterator[Any]:
    """The metric families of one look at the store."""
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
        return GaugeMetricFamily(PREFIX + name, doc, labels=["state_id", *labels])

    pipeline_count = GaugeMetricFamily(PREFIX + "fleet_pipelines", "State IDs in the store.")
    pipeline_count.add_metric([], len(pipelines))
    yield pipeline_count
    commit = gauge("last_commit_timestamp_seconds", "When the state was last written.")
    max_age = gauge("max_age_seconds", "How long the pipeline may go without a commit (--max-age).")
    started = gauge("last_run_start_timestamp_seconds", "When the last run took the lease.")
    ended = gauge("last_run_end_timestamp_seconds", "When the last run ended.")
    outcome = gauge(
        "last_run_outcome", "1 for how the last run ended (or `running`), 0 else.", ["outcome"]
    )
    exit_code = gauge("last_run_exit_code", "The last run's exit status.")
    duration = gauge("last_run_duration_seconds", "How long the last ended run took.")
    records = gauge(
        "last_run_records", "RECORD messages the last ended run passed (where it counted them)."
    )
    held = gauge("lease_held", "1 while a run holds the lease (not expired), 0 else.")
    expires = gauge("lease_expires_timestamp_seconds", "When the held lease expires.")
    held_for = gauge("lease_held_seconds", "How long the lease has been held by its run.")
    holder = gauge(
        "lease_holder_info", "The run holding the lease, and its host.", ["run_id", "host"]
    )
    for p in pipelines:
        sid = [p.state_id]
        max_age.add_metric(sid, max_ages.of(p.state_id))
        if p.last_commit is not None:
            commit.add_metric(sid, p.last_commit)
        held.add_metric(sid, 1 if p.lease_held(now) else 0)
        if p.holder is not None and p.lease_held(now):
            expires.add_metric(sid, p.holder.expires_at)
            held_for.add_metric(sid, max(0.0, now - p.holder.acquired_at))
            holder.add_metric([*sid, p.holder.run_id, p.holder.host], 1)
        r = p.last_run
        if r is None:
            continue
        started.add_metric(sid, r.started_at)
        for name in runs.OUTCOMES:
            outcome.add_metric([*sid, name], 1 if name == p.outcome else 0)
        if r.ended_at is not None:
            ended.add_metric(sid, r.ended_at)
            duration.add_metric(sid, r.duration or 0.0)
            if r.records is not None:
                records.add_metric(sid, r.records)
        if r.exit_code is not None:
            exit_code.add_metric(sid, r.exit_code)
    yield from (commit, max_age, started, ended, outcome, exit_code, duration, records)
    yield from (held, expires, held_for, holder)


class Exposition:
    """The fleet's metrics text, from a look at the store no older than ``cache_seconds``."""

    def __init__(
        self,
        watch: FleetWatch,
        max_ages: MaxAges,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self.max_ages = max_ages
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._text: bytes | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def text(self) -> bytes:
        with self._lock:
            if self._text is None or self.clock() - self._at >= self.cache_seconds:
                self._text = self._render()
                self._at = self.clock()
            return self._text

    def _render(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        pipelines = self.watch.look()
        now = time.time()
        max_ages = self.max_ages

        class Collector:
            def collect(self) -> Iterator[Any]:
                return families(pipelines, max_ages, now)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        return bytes(generate_latest(registry))


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, on 127.0.0.1) to bind."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def _handler(exposition: Exposition) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mapper-state"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":  # for a probe: costs the store nothing
                self._answer(200, b"ok\n")
                return
            if path not in ("/metrics", "/"):
                self._answer(404, b"not found: scrape /metrics\n")
                return
            try:
                body = exposition.text()
            except Exception as exc:  # noqa: BLE001 - one failed scrape, the server goes on
                message = getattr(exc, "message", None) or type(exc).__name__
                log.warning(f"metrics scrape failed: {message}")
                self._answer(503, f"the store could not be read: {message}\n".encode())
                return
            self._answer(200, body, "text/plain; version=0.0.4; charset=utf-8")

        def _refuse(self) -> None:
            self._answer(405, b"read-only: GET /metrics\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        def _answer(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up (its scrape_timeout); the look is cached all the same

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape would drown the logs

    return Handler


def _first_look(exposition: Exposition) -> None:
    """Look at the store at once, before the first scrape: on a large store the first look
    reads every lease and last run record, which may outlast a scrape's timeout."""
    try:
        exposition.text()
    except Exception as exc:  # noqa: BLE001 - the scrapes will say it again
        log.warning(f"the first look at the store failed: {getattr(exc, 'message', exc)}")


def serve(exposition: Exposition, listen: str, ready: Callable[[str], None]) -> None:
    """Answer scrapes until interrupted; ``ready`` is told the address bound."""
    host, port = parse_listen(listen)
    try:
        server = ThreadingHTTPServer((host, port), _handler(exposition))
    except OSError as exc:
        raise ConfigError(f"--listen {listen}: {exc.strerror}") from None
    server.daemon_threads = True
    threading.Thread(target=_first_look, args=(exposition,), daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    ready(f"{bound_host!s}:{bound_port}" if isinstance(bound_host, str) else f":{bound_port}")
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
