"""``meltano`` commands for the tests, forked from a Meltano that has already started.

A ``meltano`` command spends about 0.8 s of CPU importing Meltano's command line before it
reads its first argument, and the suite runs some two hundred of them on a 2-core machine.
:func:`run` hands each command to a fork server (``meltano_forkserver.py``, one per test
process and Meltano virtualenv) that imported Meltano once: the command runs in a process
of its own, forked from it, with its own arguments, environment, working directory and
pipes, and runs the launcher script the executable would (``from meltano.cli import main``),
so everything after the imports is Meltano's own start: its settings, its system database,
its state backends, the plugins it spawns. What it returns is what ``subprocess.run(...,
capture_output=True, text=True)`` returns, and like it, it waits until the command's stdout
and stderr are closed (by the command and by every process that inherited them).
:func:`spawn` starts one in the background, as ``subprocess.Popen`` would: its ``pid`` is
the command's process (to signal, or its process group with ``new_session``).

``MAPPER_STATE_TEST_MELTANO_FORK=0`` starts every command from its executable instead;
the benchmarks always do (they time the commands).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tests.support.meltano_forkserver import HEADER
from tests.support.processes import popen, stop

SERVER = Path(__file__).with_name("meltano_forkserver.py")
ENABLED = os.environ.get("MAPPER_STATE_TEST_MELTANO_FORK", "1") != "0"
#: Variables the server is started without: they are the command's, not the server's.
_COMMAND_ONLY = ("MELTANO_", "MAPPER_STATE_", "TAP_", "TARGET_")


class _Server:
    """One fork server, for the Python of one Meltano virtualenv, in this test process."""

    def __init__(self, python: Path, env: Mapping[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="meltano-fork-"))
        self.socket = self.folder / "socket"
        log = open(self.folder / "server.log", "wb")  # noqa: SIM115 - kept for the server's life
        self.proc = popen(
            [str(python), str(SERVER), str(self.socket)],
            stdout=subprocess.PIPE,
            stderr=log,
            env=dict(env),
        )
        log.close()
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready != b"ready\n":
            self.proc.wait(timeout=10)
            raise RuntimeError(
                f"the fork server of {python} did not start:\n"
                + (self.folder / "server.log").read_text(errors="replace")[-3000:]
            )

    def close(self) -> None:
        stop(self.proc, grace=5)
        with contextlib.suppress(OSError):
            for path in self.folder.iterdir():
                path.unlink()
            self.folder.rmdir()


_servers: dict[Path, _Server] = {}
_servers_lock = threading.Lock()


def _python_of(launcher: Path) -> Path:
    """The interpreter of a launcher script (its ``#!`` line)."""
    with open(launcher, "rb") as script:
        first = script.readline()
    if not first.startswith(b"#!"):
        raise ValueError(f"{launcher} is not a script with a #! line")
    return Path(first[2:].decode().split()[0])


def _server_for(launcher: Path, env: Mapping[str, str]) -> _Server:
    python = _python_of(launcher)
    with _servers_lock:
        server = _servers.get(python)
        if server is None or server.proc.poll() is not None:
            quiet = {k: v for k, v in env.items() if not k.startswith(_COMMAND_ONLY)}
            server = _servers[python] = _Server(python, quiet)
        return server


@atexit.register
def _stop_servers() -> None:
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


@contextlib.contextmanager
def _stdio(input: bytes | None) -> Iterator[tuple[list[int], list[int], threading.Thread | None]]:
    """The command's stdin, stdout and stderr, and our ends of them: stdin is /dev/null,
    or a pipe fed ``input`` by a thread (as ``subprocess.run`` does)."""
    theirs: list[int] = []
    ours: list[int] = []
    feeder = None
    try:
        if input is None:
            theirs.append(os.open(os.devnull, os.O_RDONLY))
        else:
            stdin_read, stdin_write = os.pipe()
            theirs.append(stdin_read)
            ours.append(stdin_write)

            def feed(fd: int = stdin_write, data: bytes = input) -> None:
                with contextlib.suppress(BrokenPipeError), open(fd, "wb") as pipe:
                    pipe.write(data)

            feeder = threading.Thread(target=feed, daemon=True)
        for _ in ("stdout", "stderr"):
            read_end, write_end = os.pipe()
            ours.append(read_end)
            theirs.append(write_end)
        yield theirs, ours, feeder
    finally:
        for fd in theirs:
            with contextlib.suppress(OSError):
                os.close(fd)


def _drain(fd: int, into: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(fd, "rb") as pipe:
            into.append(pipe.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _text(data: bytes) -> str:
    """What ``subprocess`` makes of a pipe's bytes with ``text=True``."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run(
    launcher: Path,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    input: bytes | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``meltano ARGS`` by ``launcher``, in ``cwd`` with ``env``: ``subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)``, forked from the fork server."""
    argv = [str(launcher), *args]
    if not ENABLED:
        return subprocess.run(
            argv,
            cwd=cwd,
            env=dict(env),
            input=input.decode() if input is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    with _stdio(input) as (theirs, ours, feeder):
        process = _start(launcher, args, cwd, env, theirs)
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        if feeder is not None:
            ours.pop(0)  # the feeder's: closed by it
            feeder.start()
        out: list[bytes] = []
        err: list[bytes] = []
        readers = [_drain(ours[0], out), _drain(ours[1], err)]
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        for reader in readers:
            reader.join(timeout)
    return subprocess.CompletedProcess(argv, returncode, _text(b"".join(out)), _text(b"".join(err)))


class ForkedProcess:
    """A command forked by the fork server, as much of ``subprocess.Popen`` as the tests
    use: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, conn: socket.socket, argv: list[str]) -> None:
        self.args = argv
        self._conn = conn
        self._replies = b""
        self.returncode: int | None = None
        self.pid = int(self._line(timeout=60))

    def _line(self, timeout: float | None) -> str:
        """The server's next reply line, waiting up to ``timeout`` (``TimeoutError``)."""
        self._conn.settimeout(timeout)
        while b"\n" not in self._replies:
            try:
                more = self._conn.recv(64)
            except BlockingIOError:  # timeout 0: nothing yet
                raise TimeoutError from None
            if not more:
                raise RuntimeError(f"the fork server hung up on {self.args}")
            self._replies += more
        line, _, self._replies = self._replies.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self._line(timeout))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(timeout=0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _start(
    launcher: Path,
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    stdio: Sequence[int],
    *,
    new_session: bool = False,
) -> ForkedProcess:
    """Ask the fork server of ``launcher``'s Python for ``meltano ARGS`` on ``stdio``."""
    server = _server_for(launcher, env)
    request = json.dumps(
        {
            "launcher": str(launcher),
            "args": list(args),
            "cwd": str(cwd),
            "env": dict(env),
            "new_session": new_session,
        }
    ).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(60)
        conn.connect(str(server.socket))
        socket.send_fds(conn, [HEADER.pack(len(request))], list(stdio))
        conn.sendall(request)
        return ForkedProcess(conn, [str(launcher), *args])
    except BaseException:
        conn.close()
        raise


#: What :func:`spawn` returns.
Process = ForkedProcess | subprocess.Popen[bytes]


def spawn(
    launcher: Path,
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    new_session: bool = False,
) -> Process:
    """``meltano ARGS`` started in the background, stdout and stderr to ``log``, stdin from
    /dev/null: ``subprocess.Popen(..., start_new_session=new_session)``, forked."""
    argv = [str(launcher), *args]
    with open(log, "wb") as out, open(os.devnull, "rb") as nothing:
        if not ENABLED:
            return subprocess.Popen(
                argv, cwd=cwd, env=dict(env), stdin=nothing, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=new_session,
            )  # fmt: skip
        return _start(
            launcher, args, cwd, env, [nothing.fileno(), out.fileno(), out.fileno()],
            new_session=new_session,
        )  # fmt: skip
