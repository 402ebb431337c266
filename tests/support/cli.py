"""``mapper-state`` run in this process through click's runner, with the result shape of a run
in a child process (:class:`subprocess.CompletedProcess` with bytes stdout and stderr, apart).

Starting a Python process costs about half a second on a busy machine; most operator-command
tests (``state``, ``lock``, ``doctor``, ``--about``) do not test the process boundary, so they
call :func:`invoke`. What a fresh process would not share with the test is isolated for the
call: the environment (exactly ``env``, by default :func:`clean_env`), the working directory,
``sys.argv`` (the lease keeps the command line), the signal handlers, the root logger, the
secrets and log format remembered by :mod:`mapper_state.log`, and the in-memory stores.

Keep a real process (:func:`tests.helpers.run_cli`) for the bare filter (it pumps file
descriptors 0 and 1), signals, pipes, FIFOs, terminals and anything about how a process ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

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
) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state ARGS`` in this process; the same arguments and result as ``run_cli``.

    ``timeout`` is accepted for the same signature; the suite's own timeout bounds the call.
    """
    from mapper_state.cli import main

    argv = [MAPPER, *args]
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
