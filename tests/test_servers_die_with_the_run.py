"""A test run that is killed outright leaves no server behind.

A helper process stands in for the test run: it starts a server the way the fixtures and
benchmarks do, prints the server's process ID and waits; it is then killed with SIGKILL, so
it can run no clean-up of its own, and the server must be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import pid_alive, wait_until

REPO = Path(__file__).resolve().parents[1]

PROXY = """
import sys, time
from tests.proxy import FaultProxy
proxy = FaultProxy("http://127.0.0.1:9")  # upstream is reached only to forward a request
proxy.start()
print(proxy._proc.pid, flush=True)
time.sleep(600)
"""

POOLED = """
import sys, time
from tests.proxy.pool import ProxyPool
pool = ProxyPool()
proxy = pool.acquire("http://127.0.0.1:9")
pool.release(proxy)  # idle in the pool, kept for the next test until the run ends
assert pool.acquire("http://127.0.0.1:9") is proxy
pool.release(proxy)
print(proxy._proc.pid, flush=True)
time.sleep(600)
"""

DETACHED = """
import subprocess, sys, time
from pathlib import Path
from tests.support.processes import killed_if_we_die
pidfile = Path(sys.argv[1])
# a daemon that detaches, as pg_ctl start leaves the PostgreSQL server
subprocess.run(["sh", "-c", f"sleep 600 >/dev/null 2>&1 & echo $! > {pidfile}"], check=True)
with killed_if_we_die(pidfile):
    print(pidfile.read_text().strip(), flush=True)
    time.sleep(600)
"""


def _start_then_kill(code: str, *args: str) -> int:
    """Run ``code`` until it prints its server's ID, SIGKILL it; the server's process ID."""
    stand_in = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert stand_in.stdout is not None
    line = stand_in.stdout.readline()
    try:
        server = int(line)
        assert pid_alive(server)
    finally:
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait()
    return server


def _gone(pid: int, what: str) -> None:
    try:
        wait_until(lambda: not pid_alive(pid), what)
    finally:  # a failed check leaves nothing behind either
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_fault_proxy_dies_with_the_process_that_started_it() -> None:
    # mitmdump runs in a session of its own (stopped as a group): the kernel still kills it
    proxy = _start_then_kill(PROXY)
    _gone(proxy, "mitmdump outlived the process that started it")


def test_a_pooled_fault_proxy_dies_with_the_process_that_started_it() -> None:
    proxy = _start_then_kill(POOLED)
    _gone(proxy, "a pooled mitmdump outlived the process that started it")


def test_a_detached_server_is_stopped_when_the_run_dies(tmp_path: Path) -> None:
    daemon = _start_then_kill(DETACHED, str(tmp_path / "server.pid"))
    _gone(daemon, "the detached server outlived the test run")
