"""No process of a run outlives its lease: the run's descendants, tracked and stopped.

A run under a lease (``run``, ``exec``, a Meltano run under the add-on's whole-run lease)
starts processes that start others: a tap behind a wrapper script, Meltano's plugins,
dbt and its threads' children. The holder of the lease stops them all before it releases
the lease, whatever ended the run (:meth:`Warden.stop_all`). When the holder is killed
outright (SIGKILL, the OOM killer) nothing of it runs any more, so a *watcher* does it:

- the holder is no child subreaper: it would inherit every orphan of its steps and, not
  being their parent's ``wait``, leave them zombies (seen in a container: a tap's shell
  leaves its ``sleep`` behind); an orphan is found by its mark (below) instead;
- the watcher is a small process in a session of its own (a Ctrl-C or a ``kill`` of the
  run's process group does not reach it) that keeps the read end of a pipe whose write
  end only the holder has; every :data:`SCAN_SECONDS` it records the holder's
  descendants from ``/proc`` (pid and start time, so that a pid reused since is never
  signalled);
- every process started after the warden inherits a mark in its environment
  (:data:`RUN_VAR`), by which one orphaned between two scans is found all the same;
- when the pipe reaches its end without the holder having said it is done, the holder
  is dead: the watcher sends SIGTERM to every recorded or marked process still alive and
  to their descendants, SIGKILL after :data:`GRACE_SECONDS`, and exits. A lease is not released
  by the watcher: it expires after its TTL, by which time nothing of the run is left.

What no mechanism here can cover: a step started in a process that is no descendant of
the holder (a service the step asks to do work, a job submitted to a cluster), a step
that escapes between two scans and clears its environment, and the watcher itself being killed with the holder (a container whose
PID 1 exits, a killed cgroup), and a process that clears its environment and escapes
before the first scan: then everything in it ends together, which is as safe.
Never signalled: the holder's parents, its shell, its process group or session as such;
only processes the holder started, directly or not.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping

#: How often the watcher records the holder's descendants.
SCAN_SECONDS = 0.5
#: How long stopped processes get between SIGTERM and SIGKILL.
GRACE_SECONDS = 5.0
#: The watcher's grace: short, the lease it ran under expires a TTL after its last renewal.
WATCHER_GRACE_SECONDS = 2.0
_DONE = b"done\n"
#: The environment variable every process of a run inherits: the tokens of the runs it is
#: part of (nested runs add theirs), by which a process orphaned between two scans is found.
RUN_VAR = "MAPPER_STATE_RUN_TOKENS"

#: A process as ``/proc`` shows it: parent pid, start time (clock ticks since boot), state.
Entry = tuple[int, int, str]


def process_table() -> dict[int, Entry]:
    """Every process of this host: ``pid -> (ppid, start time, state)`` (none without /proc)."""
    table: dict[int, Entry] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            with contextlib.suppress(IndexError, ValueError):
                table[int(name)] = (int(fields[1]), int(fields[19]), fields[0].decode())
    return table


def descendants(
    roots: Iterable[int], table: Mapping[int, Entry] | None = None, exclude: Iterable[int] = ()
) -> dict[int, int]:
    """The live descendants of ``roots`` (not the roots): ``pid -> start time``."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    skip = set(exclude)
    found: dict[int, int] = {}
    todo = [c for root in roots for c in children.get(root, ())]
    while todo:
        pid = todo.pop()
        if pid in found or pid in skip:
            continue
        _, started, state = table[pid]
        if state not in ("Z", "X"):  # a zombie is already gone; its children are not
            found[pid] = started
        todo.extend(children.get(pid, ()))
    return found


def marked(token: str, exclude: Iterable[int] = ()) -> dict[int, int]:
    """The processes of this host whose environment says they belong to the run ``token``
    (those whose environment can be read: this user's): ``pid -> start time``."""
    table = process_table()
    skip = {os.getpid(), *exclude}
    needle = token.encode()
    found: dict[int, int] = {}
    for pid, (_, started, state) in table.items():
        if pid in skip or state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            if (
                entry.startswith(RUN_VAR.encode() + b"=")
                and needle in entry.split(b"=", 1)[1].split()
            ):
                found[pid] = started
                break
    return found


def _alive(known: Mapping[int, int], table: Mapping[int, Entry]) -> dict[int, int]:
    """The processes of ``known`` still running as themselves (same start time)."""
    return {
        pid: started
        for pid, started in known.items()
        if pid in table and table[pid][1] == started and table[pid][2] not in ("Z", "X")
    }


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def stop(
    known: Mapping[int, int],
    grace: float = GRACE_SECONDS,
    roots: Iterable[int] = (),
    exclude: Iterable[int] = (),
) -> int:
    """SIGTERM ``known`` and the descendants of ``roots``, SIGKILL what is left after
    ``grace``; how many processes were running. Processes started meanwhile by the
    stopped ones are stopped too."""
    roots, exclude = list(roots), list(exclude)
    table = process_table()
    targets = {**_alive(known, table), **descendants(roots, table, exclude)}
    if not targets:
        return 0
    count = len(targets)
    _signal(targets, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace)
    while True:
        table = process_table()
        news = descendants([*roots, *targets], table, exclude)
        fresh = {p: s for p, s in news.items() if p not in targets}
        _signal(fresh, signal.SIGTERM)
        targets = {**_alive(targets, table), **fresh}
        if not targets or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    _signal(targets, signal.SIGKILL)
    return count


class Warden:
    """The holder's side: the watcher it started, and stopping its descendants itself."""

    def __init__(self, watcher: subprocess.Popen[bytes] | None, token: str) -> None:
        self.watcher = watcher
        self.token = token

    @classmethod
    def start(cls) -> Warden:
        """Mark the environment every process started from now on inherits, and start the
        watcher (none where it cannot run)."""
        token = uuid.uuid4().hex
        os.environ[RUN_VAR] = " ".join([*os.environ.get(RUN_VAR, "").split(), token])
        try:
            watcher = subprocess.Popen(
                [sys.executable, "-m", "mapper_state.warden", str(os.getpid()), token],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH")},
            )
        except OSError:
            watcher = None
        return cls(watcher, token)

    def running(self) -> dict[int, int]:
        """The holder's descendants now (not the watcher)."""
        return descendants([os.getpid()], exclude=self._watcher_pids())

    def stop_all(self, grace: float = GRACE_SECONDS) -> int:
        """Stop every process this one started (not the watcher); how many were running."""
        exclude = self._watcher_pids()
        return stop(marked(self.token, exclude), grace, roots=[os.getpid()], exclude=exclude)

    def close(self) -> None:
        """Tell the watcher the run is over and it can stand down."""
        watcher, self.watcher = self.watcher, None
        if watcher is None or watcher.stdin is None:
            return
        with contextlib.suppress(OSError):
            watcher.stdin.write(_DONE)
            watcher.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(5)

    def _watcher_pids(self) -> list[int]:
        return [self.watcher.pid] if self.watcher is not None else []


@contextlib.contextmanager
def guarding(grace: float = GRACE_SECONDS) -> Iterator[Warden]:
    """A watcher for the life of the block; at its end, whatever ended it, every process
    this one started is stopped (SIGKILL after ``grace``) and the watcher stands down."""
    warden = Warden.start()
    try:
        yield warden
    finally:
        try:
            warden.stop_all(grace)
        finally:
            warden.close()


def watch(holder: int, token: str, pipe: int = 0) -> None:
    """The watcher: record ``holder``'s descendants until its pipe ends; if it ends without
    the holder having said it is done, stop them all, and every process marked as the
    run's (:data:`RUN_VAR`): one orphaned since the last scan too."""
    known: dict[int, int] = {}
    said = b""
    first = True
    while True:
        ready, _, _ = select.select([pipe], [], [], 0.0 if first else SCAN_SECONDS)
        first = False
        if ready:
            chunk = os.read(pipe, 64)
            said += chunk
            if not chunk:
                break
            continue
        table = process_table()
        known = {**_alive(known, table), **descendants([holder], table, exclude=[os.getpid()])}
    if _DONE in said:
        return
    known.update(marked(token))
    stop(known, WATCHER_GRACE_SECONDS, roots=list(known), exclude=[os.getpid()])


if __name__ == "__main__":  # the watcher process (started by Warden.start)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.argv[2])
