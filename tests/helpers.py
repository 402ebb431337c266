"""Running the real ``mapper-state`` command in tests, and reading what it stored."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.cli import invoke
from tests.support.processes import MAPPER, clean_env, wait_until

__all__ = ["MAPPER", "clean_env", "wait_until"]  # moved to tests.support; imported from here too


def run_cli(
    *args: str,
    input: bytes = b"",
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    parent: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state *args`` in a process of its own; ``parent``: a command line that starts
    it (given the command as its arguments), e.g. a shell standing in for Meltano."""
    return subprocess.run(
        [*parent, MAPPER, *args],
        input=input,
        capture_output=True,
        cwd=cwd,
        env=clean_env() if env is None else env,
        timeout=timeout,
        check=False,
    )


def spawn_cli(
    *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [MAPPER, *args],
        stdin=kw.pop("stdin", subprocess.PIPE),
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        cwd=cwd,
        env=clean_env() if env is None else env,
        **kw,
    )


def stored_document(root: Path, state_id: str) -> dict[str, Any] | None:
    path = root / state_id / "state.json"
    return json.loads(path.read_bytes()) if path.exists() else None


def stored_state(root: Path, state_id: str) -> Any:
    doc = stored_document(root, state_id)
    return None if doc is None else doc["completed"]["singer_state"]


def state_line(value: Any) -> bytes:
    return json.dumps({"type": "STATE", "value": value}).encode() + b"\n"


def record_line(i: int, stream: str = "s") -> bytes:
    return json.dumps({"type": "RECORD", "stream": stream, "record": {"id": i}}).encode() + b"\n"


def on_store(store: Path, *args: str, input: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run ``mapper-state ARGS`` against the local-file store at ``store``."""
    return run_cli(*args, "--state-backend-uri", f"file://{store}", input=input, timeout=60)


def in_terminal(store: Path, *args: str, answer: bytes) -> subprocess.CompletedProcess[bytes]:
    """Run with stdin on a terminal that types ``answer``, as a person at a prompt would."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [MAPPER, *args, "--state-backend-uri", f"file://{store}"],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        os.close(slave)
        os.write(master, answer)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for_lease(store: Path, state_id: str, timeout: float = 10) -> dict[str, Any]:
    """The lease record once a holder has written it (``store`` is a file store's root)."""
    path = store / state_id / "mapper-state.lease.json"
    found: list[dict[str, Any]] = []

    def read() -> bool:
        try:
            found.append(json.loads(path.read_bytes()))
        except (FileNotFoundError, ValueError):
            return False
        return True

    wait_until(read, "the holder never took the lease", timeout)
    return found[-1]


RACER = """
import os, subprocess, sys, time
start, mapper, release = float(sys.argv[1]), sys.argv[2], sys.argv[3]
time.sleep(max(0, start - time.time()))
p = subprocess.Popen([mapper, "--state-id", "race"], stdin=subprocess.PIPE,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# a loser exits at once; a holder keeps its stream (and lease) open until told to finish
while p.poll() is None and not os.path.exists(release):
    time.sleep(0.02)
if p.poll() is None:
    p.communicate(b'{"type":"STATE","value":{"n":1}}\\n')
sys.exit(p.wait())
"""


def race_for_one_lease(
    cwd: Path, env: dict[str, str], *, processes: int = 6, rounds: int = 8
) -> None:
    """``processes`` real filters start together on state ID ``race``, ``rounds`` times over:
    exactly one gets the lease each time (whatever store ``env`` names).

    The holder keeps the lease until all the others have given up (exit 3), so a second
    holder, if there were one, would still be holding too and the round would fail.
    """
    for round_ in range(rounds):
        release = cwd / f"release-{round_}"
        start = time.time() + 0.3
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, str(start), MAPPER, str(release)], cwd=cwd, env=env
            )
            for _ in range(processes)
        ]
        deadline = time.monotonic() + 60
        while sum(p.poll() is not None for p in procs) < processes - 1:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        finished = sorted(p.returncode for p in procs if p.returncode is not None)
        release.touch()
        codes = sorted(p.wait(60) for p in procs)
        assert finished == [3] * (processes - 1), (round_, finished)
        assert codes == [0] + [3] * (processes - 1), (round_, codes)


#: Subcommands that pump no stream and start no child: run by click's runner in :class:`StoreCli`.
IN_PROCESS_COMMANDS = frozenset({"state", "lock", "doctor"})


class StoreCli:
    """Runs ``mapper-state`` against one store: a local directory, or a cloud emulator's
    location (a ``tests.servers.StoreLocation``), with that store's settings."""

    def __init__(self, name: str, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.env = env
        self.cwd = cwd

    @classmethod
    def local(cls, root: Path) -> StoreCli:
        return cls("local", {"MAPPER_STATE_STATE_BACKEND__URI": f"file://{root}"}, root.parent)

    @classmethod
    def cloud(cls, location: Any, cwd: Path) -> StoreCli:
        return cls(location.emulator.name, dict(location.env), cwd)

    def __call__(
        self, *args: str, input: bytes = b"", **env: str
    ) -> subprocess.CompletedProcess[bytes]:
        """In-process, but ``run`` (it starts a tap and a target) in a real process."""
        env = clean_env(**self.env, **env)
        if args and args[0] == "run":
            return run_cli(*args, input=input, cwd=self.cwd, env=env)
        on_files = not (args and args[0] in IN_PROCESS_COMMANDS)  # the filter pumps fds
        return invoke(*args, input=input, cwd=self.cwd, env=env, on_files=on_files)

    def get(self, state_id: str, *args: str) -> Any:
        """``state get ID --format json``: the stored Singer state, or None when there is none."""
        result = self("state", "get", state_id, "--format", "json", *args)
        if result.returncode == 10:
            return None
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def set(self, state_id: str, value: Any) -> None:
        result = self("state", "set", state_id, json.dumps(value))
        assert result.returncode == 0, result.stderr

    def open_store(self) -> Any:
        """A store client on the same store, to arrange what another writer would leave."""
        from mapper_state.stores import open_store

        uri = self.env["MAPPER_STATE_STATE_BACKEND__URI"]
        options: dict[str, dict[str, str]] = {}
        for key, value in self.env.items():
            if key.startswith("MAPPER_STATE_STATE_BACKEND__") and key.count("__") == 2:
                _, section, name = key.split("__")
                options.setdefault(section.lower(), {})[name.lower()] = value
        return open_store(uri, options)


FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: The tiny Singer tap of ``tests/fixtures`` as a ``--tap`` command line.
TINY_TAP = f"{sys.executable} {FIXTURES / 'tiny_tap.py'}"


def tiny_target(out: Path) -> str:
    """The tiny Singer target of ``tests/fixtures``, writing to ``out``, as a command line."""
    return f"{sys.executable} {FIXTURES / 'tiny_target.py'} {out}"


def tiny_tap_run(target: str, *extra: str) -> list[str]:
    """``run`` of state ID ``job`` from the tiny tap to ``target`` (a command line), then
    ``extra``: the arguments, without the command."""
    return ["run", "--state-id", "job", "--tap", TINY_TAP, "--target", target, *extra]


def tiny_run(workdir: Path, *extra: str) -> list[str]:
    """``run`` of state ID ``job`` from the tiny tap to the tiny target (writing
    ``workdir/out.jsonl``), then ``extra``: the arguments, without the command."""
    return tiny_tap_run(tiny_target(workdir / "out.jsonl"), *extra)


def refreshing(*streams: str) -> list[str]:
    """``--full-refresh-stream`` for each of ``streams``."""
    return [arg for stream in streams for arg in ("--full-refresh-stream", stream)]
