"""A process that imports Meltano once, then forks one child per ``meltano`` command.

Run by the Python of a Meltano virtualenv (``python meltano_forkserver.py SOCKET``): it
imports ``meltano.cli`` and the modules every command imports later (the system
database's migrations, the state backends' module), says ``ready`` on stdout and serves
requests on the Unix socket ``SOCKET``. A request is a command: its launcher (the
``meltano`` script to run), its arguments, environment and working directory, and three
file descriptors for its stdin, stdout and stderr. For each, a handler process forks the
command's process, which takes those descriptors, directory and environment and runs the
launcher as the interpreter would run the script (``__main__``, ``sys.argv``, a normal
interpreter exit with its atexit handlers); the handler sends the command's pid, then its
exit status (``-N`` for a signal, as ``subprocess`` says it).

Only the standard library and Meltano are imported here: this file runs in Meltano's
virtualenv, where the tests' own package is not importable.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import struct
import sys
from typing import Any

#: Imported before the first fork: ``meltano.cli`` and what each command imports on its way
#: (the system database's migrations, the file state backend), and boto3 where it is
#: installed (Meltano's S3 backend and the add-on's S3 store import it). The add-on's own
#: code is left to import in the command, as in a command started from its executable.
PRELOAD = (
    "meltano.cli",
    "meltano.core.migration_service",
    "alembic.runtime.migration",
    "alembic.script",
    "meltano.core.state_store.filesystem",
)
PRELOAD_IF_INSTALLED = ("boto3",)
HEADER = struct.Struct("!Q")


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: a header carrying the payload's length and the three descriptors,
    then the payload (JSON)."""
    data, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    while len(data) < HEADER.size:
        more = conn.recv(HEADER.size - len(data))
        if not more:
            raise EOFError("the request ended in its header")
        data += more
    (size,) = HEADER.unpack(data)
    payload = b""
    while len(payload) < size:
        more = conn.recv(size - len(payload))
        if not more:
            raise EOFError("the request ended in its payload")
        payload += more
    return json.loads(payload), list(fds)


def become(request: dict[str, Any], fds: list[int]) -> None:
    """In the command's process: its stdio, directory, environment and arguments."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    if request.get("new_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["launcher"], *request["args"]]
    sys.path.insert(0, os.path.dirname(request["launcher"]))  # as for a script run by path
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def handle(conn: socket.socket) -> dict[str, Any]:
    """In a handler process: fork the command; return only in the command's process."""
    request, fds = receive(conn)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # so the handler can wait for its command
    pid = os.fork()
    if pid == 0:
        conn.close()
        become(request, fds)
        return request
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def serve(listener: socket.socket) -> dict[str, Any]:
    """Accept requests for ever; return only in a command's process, with its request."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped by the kernel
    while True:
        conn, _ = listener.accept()
        if os.fork() != 0:
            conn.close()
            continue
        listener.close()
        try:
            return handle(conn)
        except BaseException as exc:  # noqa: BLE001 - a handler never returns to the accept loop
            with contextlib.suppress(OSError):
                os.write(2, f"meltano fork server: {exc!r}\n".encode())
            os._exit(70)


def main(path: str) -> None:
    # this file's folder (the tests' support package, with a meltano.py of its own) is not
    # where Meltano is imported from
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_IF_INSTALLED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # the imported modules' objects live as long as the process: out of the collector's
    # sight, a command's collections no longer walk (and copy, page by page, from this
    # process) the whole of Meltano's import: a `meltano state list` took 0.55-0.69 s of CPU
    # without this, 0.17-0.27 s with it
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    request = serve(listener)
    runpy.run_path(request["launcher"], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1])
