"""Run the fault-injecting, request-counting proxy from tests and benchmarks.

Why it exists: faults on the wire (error answers, closed connections, lost
responses of applied requests, slow or missing answers) are what the stores'
retries, deadlines and fencing are for, and request counts are what the
benchmarks measure. :class:`FaultProxy` runs ``mitmdump`` (installed in its own
virtualenv by ``scripts/install-tools.sh``, because mitmproxy's pins clash with
the project's) in reverse-proxy mode in front of an emulator, with the addon in
``tests/proxy/faults.py``, which documents the faults and the log format. This
module does not import mitmproxy: it starts the binary as a child process.

::

    with FaultProxy(moto.endpoint) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, ...)
        proxy.set_faults(drop_response=1.0, match="/lease")
        ...
        assert proxy.count("PUT", path_contains="/lease") == 1

Tests reuse running proxies through :class:`tests.proxy.pool.ProxyPool`:
:meth:`FaultProxy.reconfigure` makes a running proxy as good as a fresh one.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from tests.proxy.faults import CONTROL_PATH, FAULTS, FaultConfig
from tests.support.processes import popen, stop

__all__ = ["FAULTS", "FaultProxy", "ProxyUnavailable", "mitmdump_path"]

ROOT = Path(__file__).resolve().parent.parent.parent
ADDON = Path(__file__).resolve().parent / "faults.py"
TOOLS_DIR = Path(os.environ.get("MAPPER_STATE_TOOLS_DIR", ROOT / ".tools"))
MITMDUMP = TOOLS_DIR / "mitmproxy" / "bin" / "mitmdump"
INSTALL = "scripts/install-tools.sh"
STARTUP_SECONDS = 30
STOP_SECONDS = 5
CONTROL_SECONDS = 10  # a reset answers at once, or after its drain's 2 s at most
_START_ATTEMPTS = 3  # a port picked free can be taken before mitmdump binds it


class ProxyUnavailable(RuntimeError):
    """mitmdump is not installed, or it did not start."""


def mitmdump_path() -> Path:
    """``$MITMDUMP``, else the mitmdump that ``scripts/install-tools.sh`` installs in .tools/."""
    override = os.environ.get("MITMDUMP")
    path = Path(override) if override else MITMDUMP
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ProxyUnavailable(f"mitmdump is not installed at {path}: run {INSTALL}")
    return path


class FaultProxy:
    """mitmdump in reverse-proxy mode in front of ``target_url``, on a free port of 127.0.0.1.

    ``faults`` is the initial control file content (keys in ``tests/proxy/faults.py``;
    None means count only). The Host header reaches the server unchanged, as the
    client signed it (``keep_host_header``). ``url`` is ``target_url`` with the
    proxy's address: a target with a path (Azurite's ``/devstoreaccount1``) keeps it.
    """

    def __init__(
        self, target_url: str, *, faults: dict[str, Any] | None = None, seed: int = 0
    ) -> None:
        parts = urlsplit(target_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"target_url must be http(s)://host:port[/path], not {target_url!r}")
        self.target_url = target_url
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._path = parts.path.rstrip("/")
        self.seed = seed
        self._initial_faults = dict(faults or {})
        FaultConfig.from_mapping(self._initial_faults)  # fail here, not in the proxy
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    # -- life cycle ---------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start mitmdump and wait until it accepts connections with the addon loaded."""
        if self._proc is not None:
            raise RuntimeError("the proxy is already running")
        binary = mitmdump_path()
        self._tmp = Path(tempfile.mkdtemp(prefix="fault-proxy-"))
        self._write_faults(self._initial_faults)
        try:
            for attempt in range(1, _START_ATTEMPTS + 1):
                if self._start_once(binary, last=attempt == _START_ATTEMPTS):
                    return
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop mitmdump's process group and remove its files (the request log too)."""
        self._stop_process()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self.port = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def reconfigure(
        self, *, seed: int = 0, faults: dict[str, Any] | None = None, drain: bool = False
    ) -> bool:
        """Make the running proxy as good as one just started with ``seed`` and ``faults``.

        The request log and mitmdump's output are emptied, the request numbering and the
        fault counters start again and the draws restart from ``seed``. With ``drain``,
        requests an earlier user left held are closed first and its pending ``late``
        copies dropped. False (nothing changed but the control file) if a request is still
        in flight or the proxy does not answer: the proxy is then not fit for reuse.
        """
        FaultConfig.from_mapping(faults or {})
        if not self.running or self.port is None:
            return False
        self._write_faults(dict(faults or {}))
        body = json.dumps({"seed": seed, "drain": drain})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=CONTROL_SECONDS)
        try:
            conn.request("POST", CONTROL_PATH, body, {"Content-Type": "application/json"})
            status = conn.getresponse().status
        except OSError:
            return False
        finally:
            conn.close()
        if status != 200:
            return False
        self.seed = seed
        self._initial_faults = dict(faults or {})
        with open(self.output_log, "r+b") as f:
            f.truncate(0)  # mitmdump appends: its next line starts the file again
        return True

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (plus the target's path, if it has one)."""
        if self.port is None:
            raise RuntimeError("the proxy is not running")
        return f"http://127.0.0.1:{self.port}{self._path}"

    @property
    def faults_file(self) -> Path:
        return self._dir / "faults.json"

    @property
    def requests_log(self) -> Path:
        return self._dir / "requests.jsonl"

    @property
    def output_log(self) -> Path:
        """mitmdump's own output (warnings, the addon's errors)."""
        return self._dir / "mitmdump.log"

    # -- faults and counts --------------------------------------------------------

    def set_faults(self, **faults: Any) -> None:
        """Replace the faults (no arguments: count only); the next request sees them.

        E.g. ``set_faults(error=1.0, error_statuses=[503], match="/lease", max_faults=2)``.
        """
        FaultConfig.from_mapping(faults)
        self._write_faults(faults)

    def requests(self) -> list[dict[str, Any]]:
        """The request log so far, in the order the proxy settled the requests."""
        try:
            text = self.requests_log.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        return [json.loads(line) for line in lines[:-1] if line]  # [-1]: an unfinished line

    def count(
        self,
        method: str | None = None,
        path_contains: str | None = None,
        *,
        fault: str | None = None,
    ) -> int:
        """How many logged requests match ``method``, ``path_contains`` and ``fault``."""
        return sum(
            1
            for r in self.requests()
            if (method is None or r["method"] == method.upper())
            and (path_contains is None or path_contains in r["path"])
            and (fault is None or r["fault"] == fault)
        )

    def clear(self) -> None:
        """Empty the request log (the proxy appends to it; counting starts again)."""
        with open(self.requests_log, "r+b") as f:
            f.truncate(0)

    # -- internals ------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self._tmp is None:
            raise RuntimeError("the proxy is not running")
        return self._tmp

    def _write_faults(self, faults: dict[str, Any]) -> None:
        tmp = self._dir / "faults.json.tmp"
        tmp.write_text(json.dumps(faults), encoding="utf-8")
        os.replace(tmp, self.faults_file)  # the addon never reads half a file

    def _start_once(self, binary: Path, *, last: bool) -> bool:
        self.port = _free_port()
        self._ready_file.unlink(missing_ok=True)
        args = [
            str(binary),
            "-s", str(ADDON),
            "--mode", f"reverse:{self._origin}",
            "--listen-host", "127.0.0.1",
            "--listen-port", str(self.port),
            "--set", "keep_host_header=true",  # SigV4 signs the Host the client sent
            "--set", "connection_strategy=lazy",  # connect upstream only to forward
            "--set", f"confdir={self._dir / 'conf'}",  # its CA files, not in ~/.mitmproxy
            "--set", "termlog_verbosity=warn",
            "--set", "flow_detail=0",
            "--set", f"faults_file={self.faults_file}",
            "--set", f"requests_log={self.requests_log}",
            "--set", f"faults_seed={self.seed}",
            "--set", f"ready_file={self._ready_file}",
        ]  # fmt: skip
        with open(self.output_log, "ab") as out:
            self._proc = popen(  # dies with the process that started it, session or not
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped as a whole
            )
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            # The addon writes the ready file once mitmproxy listens, with the addresses.
            if self._listening() and _accepts(self.port):
                return True
            time.sleep(0.05)
        output = self.output_log.read_text(errors="replace")[-3000:]
        exited = self._proc.poll() is not None
        self._stop_process()
        if exited and not last and "address already in use" in output.lower():
            return False
        raise ProxyUnavailable(
            f"mitmdump did not start (reverse proxy to {self._origin} on port {self.port}):\n"
            f"{output}"
        )

    @property
    def _ready_file(self) -> Path:
        return self._dir / "ready.json"

    def _listening(self) -> bool:
        try:
            ready = json.loads(self._ready_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return False
        return ["127.0.0.1", self.port] in ready["listen"]

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            stop(proc, grace=STOP_SECONDS, group=True)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything it left in its group


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
