"""Child processes that die with the test run, free ports, and waiting for a condition.

Every server a test or benchmark starts goes through :func:`popen`: on Linux the child asks
the kernel (``PR_SET_PDEATHSIG``) to be killed with SIGKILL when the process that started it
dies, so a test run killed outright (SIGKILL, a CI timeout) leaves no server behind, even one
started in a session of its own (``start_new_session=True``) to be stopped as a group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

MAPPER = str(Path(sys.executable).parent / "mapper-state")

_PR_SET_PDEATHSIG = 1
# Looked up before any fork: the function runs in the child between fork and exec.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent() -> None:
    """In a child about to exec: be killed when the thread that started it ends (Linux).

    A test run that is killed cannot stop its servers itself; the kernel does.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def popen(
    args: Sequence[str | os.PathLike[str]],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    start_new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a server (or any helper) that is killed if this process dies first.

    The death signal is tied to the thread that starts the child, so it is asked for only from
    the main thread (fixtures run there); a child started from another thread would otherwise
    die as soon as that thread ends.
    """
    on_main = threading.current_thread() is threading.main_thread()
    return subprocess.Popen(
        args,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        start_new_session=start_new_session,
        preexec_fn=die_with_parent if on_main else None,
    )


def stop(proc: subprocess.Popen[bytes], *, grace: float = 10, group: bool = False) -> None:
    """SIGTERM (to its process group when ``group``), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                if group:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
    proc.wait()


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any mapper-state or Meltano settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAPPER_STATE_", "MELTANO_", "AWS_", "AZURE_", "GOOGLE_"))
    }
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Poll ``condition`` until it holds; fail the test saying ``what`` did not happen."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """Whether a process with this ID exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # gone (or going) between the listing and the read
        return False


_WATCHDOG = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
pidfile, sig = sys.argv[1], int(sys.argv[2])
if sys.stdin.buffer.read() == b"":  # end of file without a word: whoever started us died
    try:
        with open(pidfile) as f:
            os.kill(int(f.readline()), sig)
    except (OSError, ValueError):
        pass
"""


@contextlib.contextmanager
def killed_if_we_die(pidfile: Path, sig: int = signal.SIGKILL) -> Iterator[None]:
    """For a daemon that detaches (``pg_ctl start``): if this process dies inside the block,
    a watchdog sends ``sig`` to the process whose ID is the first line of ``pidfile``.

    The watchdog waits for the end of a pipe only this process writes to; leaving the block
    says so on the pipe, and the watchdog exits without a signal. It runs in a session of its
    own, so a signal to the test run's process group does not stop it before it acts.
    """
    dog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(pidfile), str(int(sig))],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    assert dog.stdin is not None
    try:
        yield
    finally:
        dog.stdin.write(b"done")
        dog.stdin.close()
        dog.wait()
