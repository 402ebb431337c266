"""A mitmproxy addon that injects network faults and counts every request.

Why it exists: the stores must survive a real network's failures, where the
request may or may not have been applied: an error answer, a connection closed
before or after the server applied the request, a slow answer, no answer at all.
Emulators never fail like that, so the tests put mitmproxy in reverse-proxy mode
between an SDK and an emulator with this addon. The same addon logs one JSON line
per request, so with no fault configured it is the request counter of the
benchmarks.

Run it with::

    mitmdump -s tests/proxy/faults.py --mode reverse:http://127.0.0.1:PORT \
        --listen-host 127.0.0.1 --listen-port N --set keep_host_header=true \
        --set faults_file=faults.json --set requests_log=requests.jsonl

(``tests.proxy.FaultProxy`` does this for tests and benchmarks.)

Options (``--set NAME=VALUE``):

``faults_file``
    JSON control file (below). Read at start and again whenever it changes
    (inode, mtime or size), checked on every request, so faults can change while
    the proxy runs; write it atomically (a temporary file, then rename). A missing
    file means no faults.
``requests_log``
    File that gets one JSON line per request (appended, flushed at once).
``faults_match``
    Default for the control file's ``match``.
``faults_seed``
    Seed of the random draws; the generator restarts from it at each load of the
    control file, so the n-th request after a load always gets the same draw.
``ready_file``
    File written (``{"listen": [[host, port], ...]}``) once mitmproxy listens:
    mitmproxy calls the ``running`` hook only after its servers are bound.

A ``POST /.fault-proxy/reset`` to the proxy itself (never forwarded, never logged)
makes a running proxy as good as a fresh one, so tests can reuse it: its JSON body
``{"seed": N, "drain": BOOL}`` sets the seed, and the proxy empties the request log,
restarts the request numbering and reads the control file again (the draws restart
from the new seed). With ``drain`` it first ends whatever an earlier user left
behind: held requests (``blackhole``, ``delay``, ``delay_request``) are closed at
once instead of forwarded or answered, pending ``late`` copies are never sent. It
answers 200 once reset, 409 (and changes nothing) while a request is still in
flight (``{"in_flight": N}`` says how many), 500 if the control file is unreadable.

The control file is a JSON object; every key is optional:

=================  ===========================================================
``reset``          rate: close the client connection without forwarding (the
                   server never sees the request)
``error``          rate: answer a status from ``error_statuses`` without
                   forwarding
``throttle``       rate: answer ``throttle_status`` with an S3 ``SlowDown``
                   body without forwarding
``blackhole``      rate: never forward, never answer: hold the request for
                   ``blackhole_seconds``, then close the connection
``drop_response``  rate: forward (the server applies the request), then close
                   the client connection instead of answering
``error_applied``  rate: forward (the server applies the request), then answer
                   a status from ``error_statuses`` instead of its response
``delay_request``  rate: hold the request ``delay_seconds``, then forward it
``delay``          rate: forward, then hold the response ``delay_seconds``
``late``           rate: close the client connection at once, and send the
                   request to the server ``delay_seconds`` later all the same
                   (a request that a slow network delivers after the client
                   gave up: the server applies it late; logged again, as
                   ``late_arrival``, when it reaches the server)
``error_statuses`` list of statuses for ``error`` and ``error_applied``
                   (default ``[500, 503]``, one picked at random)
``throttle_status`` status for ``throttle`` (default 503; GCS uses 429)
``delay_seconds``  float, default 1.0
``blackhole_seconds`` float, default 3600.0
``match``          apply faults only to requests whose path contains this
                   substring (null or absent: every request)
``body_match``     apply faults only to requests whose body contains this
                   substring (a GCS upload names its object in the body's
                   metadata part, not in the path)
``methods``        apply faults only to these methods, e.g. ``["PUT"]``
``max_faults``     stop injecting after this many faults since the file was
                   loaded (null or absent: no limit)
``skip``           let the first this many requests that ``match``,
                   ``body_match``, ``methods`` and ``headers`` select since the
                   file was loaded pass untouched (a lease's create, before the
                   takeover that follows it)
``headers``        apply faults only to requests that carry every one of these
                   headers, e.g. ``["If-Match"]`` (a conditional delete)
=================  ===========================================================

Rates are probabilities in [0, 1] that add up to at most 1: each request gets
one uniform draw, and the faults share the unit interval in the order above.
All rates 0 (or an empty object, or no file) is "count only": every request
passes through untouched.

Each log line is ``{"seq", "time", "method", "path", "query", "status", "fault",
"upstream_status", "error", "request_bytes", "response_bytes", "elapsed"}``:
``path`` is the raw (percent-encoded) request path without its query, ``query``
the raw query string (``""`` for none), ``status`` what the client was sent (null
when it got no answer), ``fault`` the fault applied (null for none),
``upstream_status`` the server's status when the request was forwarded (null when
it was not), ``error`` mitmproxy's error for the flow (e.g. the client went away),
the byte counts those of the bodies (the response's null when none was sent),
``time`` when the request was read (Unix time) and ``elapsed`` the seconds from
then until the line was written. A line is written
before the client sees the outcome (a black-holed request's line when it is
held), so a client that got its answer (or its error) can count on its line
being there.

This module imports mitmproxy only inside the addon's hooks, so the test helper
can import :class:`FaultConfig` (to check a control file before writing it)
from an environment without mitmproxy.
"""

# No ``from __future__ import annotations``: mitmproxy loads a script without putting it
# in sys.modules, where dataclasses look string annotations up. The annotations naming
# mitmproxy's types are quoted instead.
import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from mitmproxy import http
    from mitmproxy.addonmanager import Loader

logger = logging.getLogger(__name__)

#: The faults, in the order in which they share the unit interval of the draw.
FAULTS = (
    "reset",
    "error",
    "throttle",
    "blackhole",
    "drop_response",
    "error_applied",
    "delay_request",
    "delay",
    "late",
)
#: The path of the control request (S3, Azure and GCS names never start with a dot).
CONTROL_PATH = "/.fault-proxy/reset"
#: How long a reset waits for the requests it ended to settle before answering 409.
_SETTLE_SECONDS = 2.0
#: Faults decided and applied before the request is forwarded (the server never sees it).
NOT_FORWARDED = frozenset({"reset", "error", "throttle", "blackhole", "late"})

_REASONS = {
    429: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    501: ("NotImplemented", "A header you provided implies functionality that is not implemented."),
    502: ("BadGateway", "Bad gateway."),
    503: ("ServiceUnavailable", "Service is unable to handle request."),
    504: ("GatewayTimeout", "Gateway timeout."),
}


def _require(ok: bool, name: str, what: str, value: Any) -> None:
    """Raise ``ValueError`` saying what ``name`` must be, unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}: {what}, not {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_list_of_str(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _rates(data: Mapping[str, Any]) -> dict[str, float]:
    """Each fault's rate, checked: numbers in [0, 1] that add up to at most 1."""
    rates: dict[str, float] = {}
    for name in FAULTS:
        rate = data.get(name, 0)
        _require(_is_number(rate) and 0 <= rate <= 1, name, "a rate is a number in [0, 1]", rate)
        if rate:
            rates[name] = float(rate)
    if sum(rates.values()) > 1 + 1e-9:
        raise ValueError(f"the rates add up to more than 1: {rates}")
    return rates


@dataclass(frozen=True)
class FaultConfig:
    """The control file's content, checked."""

    rates: Mapping[str, float] = field(default_factory=dict)
    error_statuses: tuple[int, ...] = (500, 503)
    throttle_status: int = 503
    delay_seconds: float = 1.0
    blackhole_seconds: float = 3600.0
    match: str | None = None
    methods: frozenset[str] | None = None
    max_faults: int | None = None
    body_match: str | None = None
    skip: int = 0
    headers: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "FaultConfig":
        """Check a control file's object; raise ``ValueError`` saying what is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"the control file must hold a JSON object, not {data!r}")
        params = {
            "error_statuses",
            "throttle_status",
            "delay_seconds",
            "blackhole_seconds",
            "match",
            "methods",
            "max_faults",
            "body_match",
            "skip",
            "headers",
        }
        unknown = set(data) - set(FAULTS) - params
        if unknown:
            raise ValueError(
                f"unknown key(s) {sorted(unknown)}; known: {sorted((*FAULTS, *params))}"
            )
        rates = _rates(data)
        statuses = data.get("error_statuses", [500, 503])
        _require(
            isinstance(statuses, list) and bool(statuses) and all(_is_status(s) for s in statuses),
            "error_statuses", "a non-empty list of statuses", statuses,
        )  # fmt: skip
        throttle_status = data.get("throttle_status", 503)
        _require(_is_status(throttle_status), "throttle_status", "a status", throttle_status)
        seconds = {}
        for name, default in (("delay_seconds", 1.0), ("blackhole_seconds", 3600.0)):
            value = data.get(name, default)
            _require(_is_number(value) and value >= 0, name, "a number of seconds >= 0", value)
            seconds[name] = float(value)
        match, body_match = data.get("match"), data.get("body_match")
        _require(match is None or isinstance(match, str), "match", "a string or null", match)
        _require(
            body_match is None or isinstance(body_match, str),
            "body_match", "a string or null", body_match,
        )  # fmt: skip
        methods = data.get("methods")
        _require(
            methods is None or _is_list_of_str(methods),
            "methods", "a list of HTTP methods or null", methods,
        )  # fmt: skip
        max_faults = data.get("max_faults")
        _require(
            max_faults is None or _is_count(max_faults),
            "max_faults", "an integer >= 0 or null", max_faults,
        )  # fmt: skip
        skip = data.get("skip", 0)
        _require(_is_count(skip), "skip", "an integer >= 0", skip)
        headers = data.get("headers", [])
        _require(_is_list_of_str(headers), "headers", "a list of header names", headers)
        return cls(
            skip=skip,
            headers=tuple(h.lower() for h in headers),
            rates=rates,
            error_statuses=tuple(statuses),
            throttle_status=throttle_status,
            delay_seconds=seconds["delay_seconds"],
            blackhole_seconds=seconds["blackhole_seconds"],
            match=match or None,
            methods=frozenset(m.upper() for m in methods) if methods is not None else None,
            max_faults=max_faults,
            body_match=body_match or None,
        )

    def applies_to(
        self, method: str, path: str, body: bytes = b"", headers: Sequence[str] = ()
    ) -> bool:
        """Whether faults may be applied to this request at all (``headers``: its names)."""
        if self.match is not None and self.match not in path:
            return False
        names = {h.lower() for h in headers}
        if any(h not in names for h in self.headers):
            return False
        if self.body_match is not None and self.body_match.encode() not in body:
            return False
        return self.methods is None or method.upper() in self.methods

    def pick(self, draw: float) -> str | None:
        """The fault that a uniform draw in [0, 1) selects, or None."""
        edge = 0.0
        for name in FAULTS:
            edge += self.rates.get(name, 0.0)
            if draw < edge:
                return name
        return None


def _is_status(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599


def error_body(status: int, path: str) -> bytes:
    """An S3-style XML error (Azure's errors have the same shape; GCS reads the status)."""
    code, message = _REASONS.get(status, ("InternalError", "Injected error."))
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_xml_escape(path)}</Resource>"
        "<RequestId>fault-proxy</RequestId></Error>"
    ).encode()


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class FaultInjector:
    """The addon: decides each request's fault, applies it and logs the request."""

    def __init__(self) -> None:
        self.config = FaultConfig()
        self._file_stamp: tuple[int, int, int] | None = None
        self._rng = random.Random(0)
        self._seed = 0
        self._faults_applied = 0
        self._selected = 0  # requests the filters selected since the file was loaded
        self._log: TextIO | None = None
        self._seq = 0
        self._late_tasks: set[asyncio.Task[None]] = set()
        self._flows: set[http.HTTPFlow] = set()  # seen since the last reset; some still live
        self._drain: asyncio.Event | None = None  # set to end the holds of the last user

    # -- mitmproxy hooks -----------------------------------------------------------

    def load(self, loader: "Loader") -> None:
        loader.add_option("faults_file", str, "", "JSON control file of the faults to inject.")
        loader.add_option("requests_log", str, "", "File that gets one JSON line per request.")
        loader.add_option(
            "faults_match", str, "", "Inject faults only into requests whose path contains this."
        )
        loader.add_option("faults_seed", int, 0, "Seed of the fault draws.")
        loader.add_option("ready_file", str, "", "File written once the proxy listens.")

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if "requests_log" in updated:
            if self._log is not None:
                self._log.close()
                self._log = None
            if ctx.options.requests_log:
                self._log = open(ctx.options.requests_log, "a", encoding="utf-8")  # noqa: SIM115
        if "faults_seed" in updated:
            self._seed = ctx.options.faults_seed
        if updated & {"faults_file", "faults_match", "faults_seed"}:
            self._file_stamp = None
            self._reload(force=True)

    def running(self) -> None:
        from mitmproxy import ctx

        if not ctx.options.ready_file:
            return
        proxyserver = ctx.master.addons.get("proxyserver")
        listen = [list(addr[:2]) for addr in proxyserver.listen_addrs()]
        tmp = f"{ctx.options.ready_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"listen": listen}, f)
        os.replace(tmp, ctx.options.ready_file)

    def done(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def requestheaders(self, flow: "http.HTTPFlow") -> None:
        if _path(flow) != CONTROL_PATH:
            self._flows.add(flow)  # in flight from its headers on, until it is no longer live
            if len(self._flows) > 64:
                self._in_flight()  # forget the settled ones (and their bodies)

    async def request(self, flow: "http.HTTPFlow") -> None:
        if _path(flow) == CONTROL_PATH:
            await self._control(flow)
            return
        self._flows.add(flow)  # a late copy replayed by the proxy itself
        if flow.metadata.get("faults.late_copy"):  # a late request, arriving now: no new fault
            flow.metadata["faults.fault"] = "late_arrival"
            flow.metadata["faults.start"] = time.time()
            return
        fault = self._decide(flow)
        if fault is None:
            return
        config: FaultConfig = flow.metadata["faults.config"]
        if fault == "reset":
            self._record(flow)
            flow.kill()
        elif fault == "error":
            flow.response = self._error_response(flow, self._rng.choice(config.error_statuses))
        elif fault == "throttle":
            flow.response = self._error_response(flow, config.throttle_status, throttle=True)
        elif fault == "blackhole":
            self._record(flow)
            await self._hold(config.blackhole_seconds)
            if flow.killable:
                flow.kill()
        elif fault == "delay_request":
            await self._hold_or_kill(flow, config.delay_seconds)
        elif fault == "late":
            self._send_late(flow, config.delay_seconds)
            self._record(flow)
            flow.kill()

    async def response(self, flow: "http.HTTPFlow") -> None:
        if flow.metadata.get("faults.control"):
            return
        fault = flow.metadata.get("faults.fault")
        config: FaultConfig = flow.metadata.get("faults.config", self.config)
        if fault not in NOT_FORWARDED and flow.response is not None:
            flow.metadata["faults.upstream_status"] = flow.response.status_code
        if fault == "drop_response":
            self._record(flow)
            flow.kill()
            return
        if fault == "error_applied":
            flow.response = self._error_response(flow, self._rng.choice(config.error_statuses))
        elif fault == "delay":
            await self._hold_or_kill(flow, config.delay_seconds)
        self._record(flow)

    def error(self, flow: "http.HTTPFlow") -> None:
        if not flow.metadata.get("faults.control"):
            self._record(flow)

    # -- internals -----------------------------------------------------------------

    def _decide(self, flow: "http.HTTPFlow") -> str | None:
        """Draw the request's fault (None: none) under the control file's faults."""
        self._reload()
        config = self.config
        flow.metadata["faults.config"] = config
        flow.metadata["faults.start"] = time.time()
        draw = self._rng.random()  # one draw per request, matching or not: reproducible
        body = flow.request.raw_content or b""
        selected = config.applies_to(
            flow.request.method, _path(flow), body, list(flow.request.headers.keys())
        )
        if selected:
            self._selected += 1
        if not (
            selected
            and self._selected > config.skip
            and (config.max_faults is None or self._faults_applied < config.max_faults)
        ):
            return None
        fault = config.pick(draw)
        if fault is not None:
            self._faults_applied += 1
            flow.metadata["faults.fault"] = fault
        return fault

    async def _hold_or_kill(self, flow: "http.HTTPFlow", seconds: float) -> None:
        """Hold a request or its response ``seconds``; if a reset drains the proxy first,
        close it instead: its user is gone, and the server must not see it after."""
        if await self._hold(seconds) and flow.killable:
            flow.kill()

    async def _hold(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if a reset drains the proxy: True if drained."""
        if self._drain is None:
            self._drain = asyncio.Event()
        drain = self._drain
        try:
            await asyncio.wait_for(drain.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    def _in_flight(self) -> int:
        self._flows = {f for f in self._flows if f.live}
        return len(self._flows)

    async def _control(self, flow: "http.HTTPFlow") -> None:
        """Answer a reset (module docstring): the proxy as a fresh one with the new seed."""
        from mitmproxy import http

        flow.metadata["faults.control"] = True
        try:
            body = json.loads(flow.request.raw_content or b"{}")
            seed, drain = body.get("seed", 0), bool(body.get("drain", False))
            _require(isinstance(seed, int) and not isinstance(seed, bool), "seed", "an int", seed)
        except (ValueError, AttributeError) as e:
            flow.response = http.Response.make(400, str(e).encode())
            return
        if drain:
            await self._end_holds()
        in_flight = self._in_flight()
        if in_flight:
            flow.response = http.Response.make(409, json.dumps({"in_flight": in_flight}))
            return
        self._seed = seed
        self._seq = 0
        self._flows.clear()
        if self._log is not None:
            self._log.truncate(0)  # opened to append: the next line starts the file again
        if not self._reload(force=True):  # a fresh generator from the new seed, counters at 0
            flow.response = http.Response.make(500, b"the control file is unreadable or wrong")
            return
        flow.response = http.Response.make(200, json.dumps({"in_flight": 0}))

    async def _end_holds(self) -> None:
        """End the holds and drop the late copies of an earlier user; let its flows settle."""
        for task in list(self._late_tasks):
            task.cancel()
        if self._drain is not None:
            self._drain.set()
            self._drain = None
        deadline = time.monotonic() + _SETTLE_SECONDS
        while self._in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _send_late(self, flow: "http.HTTPFlow", delay: float) -> None:
        """Replay a copy of the request to the server after ``delay``, whatever the client does."""
        from mitmproxy import ctx

        late = flow.copy()
        late.metadata.clear()
        late.metadata["faults.late_copy"] = True

        async def send() -> None:
            await asyncio.sleep(delay)
            ctx.master.commands.call("replay.client", [late])

        task = asyncio.get_running_loop().create_task(send())
        self._late_tasks.add(task)
        task.add_done_callback(self._late_tasks.discard)

    def _reload(self, *, force: bool = False) -> bool:
        """Read the control file again if it changed since the last read; False if it is
        unreadable or wrong (the faults stay as they were)."""
        from mitmproxy import ctx

        path = ctx.options.faults_file
        try:
            st = os.stat(path) if path else None
        except FileNotFoundError:
            st = None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None
        if not force and stamp == self._file_stamp:
            return True
        self._file_stamp = stamp
        data: dict[str, Any] = {}
        if st is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                logger.error(
                    "fault proxy: cannot read %s (keeping the faults as they were): %s", path, e
                )
                return False
        if ctx.options.faults_match and "match" not in data:
            data = {**data, "match": ctx.options.faults_match}
        try:
            self.config = FaultConfig.from_mapping(data)
        except ValueError as e:
            logger.error("fault proxy: %s: %s (keeping the faults as they were)", path, e)
            return False
        self._rng = random.Random(self._seed)
        self._faults_applied = 0
        self._selected = 0
        logger.info("fault proxy: faults now %s", self.config)
        return True

    def _error_response(
        self, flow: "http.HTTPFlow", status: int, *, throttle: bool = False
    ) -> "http.Response":
        from mitmproxy import http

        if flow.request.method == "HEAD":
            body = b""  # a HEAD answer has no body
        elif throttle:
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?>\n'
                b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
                b"</Message><RequestId>fault-proxy</RequestId></Error>"
            )
        else:
            body = error_body(status, _path(flow))
        headers = {"Content-Type": "application/xml", "x-fault-proxy": "injected"}
        if throttle:
            headers["Retry-After"] = "1"
        return http.Response.make(status, body, headers)

    def _record(self, flow: "http.HTTPFlow") -> None:
        """Log the request once (hooks may see the same flow twice)."""
        if flow.metadata.get("faults.logged"):
            return
        flow.metadata["faults.logged"] = True
        self._seq += 1
        fault = flow.metadata.get("faults.fault")
        answered = flow.response is not None and fault not in (
            "reset",
            "blackhole",
            "drop_response",
            "late",
        )
        start = flow.metadata.get("faults.start", flow.request.timestamp_start)
        line = {
            "seq": self._seq,
            "time": start,
            "method": flow.request.method,
            "path": _path(flow),
            "query": flow.request.path.partition("?")[2],
            "status": flow.response.status_code if answered and flow.response else None,
            "fault": fault,
            "upstream_status": flow.metadata.get("faults.upstream_status"),
            "error": flow.error.msg if flow.error else None,
            "request_bytes": len(flow.request.raw_content or b""),
            "response_bytes": (
                len(flow.response.raw_content or b"") if answered and flow.response else None
            ),
            "elapsed": round(time.time() - start, 6),
        }
        if self._log is not None:
            self._log.write(json.dumps(line) + "\n")
            self._log.flush()


def _path(flow: "http.HTTPFlow") -> str:
    path: str = flow.request.path
    return path.split("?", 1)[0]


addons = [FaultInjector()]
