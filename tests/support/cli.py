"""``mapper-state`` run in this process through click's runner, with the result shape of a run
in a child process (:class:`subprocess.CompletedProcess` with bytes stdout and stderr, apart).

Starting a Python process costs about half a second on a busy machine; most operator-command
tests (``state``, ``lock``, ``doctor``, ``--about``) do not test the process boundary, so they
call :func:`invoke`. What a fresh process would not share with the test is isolated for the
call: the environment (exactly ``env``, by default :func:`clean_env`), the working directory,
``sys.argv`` (the lease keeps the command line), the signal handlers, the root logger, the
secrets and log format remembered by :mod:`mapper_state.log`, and the in-memory stores.

The bare filter pumps raw file descriptors (``sys.stdin.fileno()``), which click's runner
does not have: :func:`invoke_filter` runs it in-process on temporary files instead, with the
same isolation. Keep a real process (:func:`tests.helpers.run_cli`) for signals, pipes,
FIFOs, terminals, a lease held while another run starts, and anything about how a process
ends.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from click.testing import CliRunner

from tests.support.processes import MAPPER, clean_env

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE)


@contextlib.contextmanager
def _as_a_fresh_process(
    args: list[str], cwd: Path | str | None, env: dict[str, str]
) -> Iterator[None]:
    from mapper_state import log, redact
    from mapper_state.stores import memory

    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_argv = sys.argv
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    os.environ.clear()
    os.environ.update(env)
    sys.argv = args
    redact.remember(())
    log._json = False
    memory._STORES.clear()
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        redact.remember(())
        log._json = False
        memory._STORES.clear()


def invoke(
    *args: str,
    input: bytes = b"",
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    on_files: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state ARGS`` in this process; the same arguments and result as ``run_cli``.

    Through click's runner, or with ``on_files`` on temporary files (:func:`invoke_filter`).
    ``timeout`` is accepted for the same signature; the suite's own timeout bounds the call.
    """
    from mapper_state.cli import main

    argv = [MAPPER, *args]
    if on_files:
        return _on_files(main, argv, input, cwd, clean_env() if env is None else env)
    with _as_a_fresh_process(argv, cwd, clean_env() if env is None else env):
        result = CliRunner().invoke(main, list(args), input=input, prog_name="mapper-state")
    stderr = result.stderr_bytes
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # what the interpreter would print for an exception nothing caught
        exc = result.exception
        stderr += "".join(traceback.format_exception(exc)).encode()
        code = 1
    return subprocess.CompletedProcess(argv, code, result.stdout_bytes, stderr)


def invoke_on_store(
    store: Path, *args: str, input: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state ARGS`` in this process against the local-file store at ``store``."""
    return invoke(*args, "--state-backend-uri", f"file://{store}", input=input)


def invoke_filter(*args: str, **options: Any) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state ARGS`` in this process with stdin, stdout and stderr on temporary files
    (real file descriptors, for the filter's pump); the same arguments and result as
    ``run_cli``. Any command runs this way; the filter must.
    """
    return invoke(*args, on_files=True, **options)


def _on_files(
    main: Any, argv: list[str], input: bytes, cwd: Path | str | None, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        stdin.write(input)
        stdin.flush()
        stdin.seek(0)
        with _as_a_fresh_process(argv, cwd, env):
            code = _run_main(main, argv[1:], stdin, stdout, stderr)
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(argv, code, stdout.read(), stderr.read())


def _run_main(
    main: Any, args: list[str], stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]
) -> int:
    """Call the command with the standard streams on these files; its exit code."""

    def text(f: IO[bytes], mode: str) -> io.TextIOWrapper:
        raw = io.FileIO(f.fileno(), mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "rb" else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding="utf-8", write_through=True)

    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = text(stdin, "rb"), text(stdout, "wb"), text(stderr, "wb")
    code: int = 0
    try:
        main.main(args=args, prog_name="mapper-state")
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
        code = 1 if isinstance(exc.code, str) else int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 (what the interpreter prints for an uncaught exception)
        sys.stderr.write("".join(traceback.format_exception(exc)))
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdin, sys.stdout, sys.stderr = saved
    return code


def one_line_error(stderr: bytes | str, *needles: str) -> str:
    """The line a refused command printed: one line, no traceback, holding each of ``needles``."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    assert text.count("\n") == 1, text
    assert text.endswith("\n"), text
    assert text.startswith("mapper-state: error: "), text
    for needle in needles:
        assert needle in text, text
    return text.rstrip("\n")
