"""``mapper-state exec -- COMMAND``: the lease held for the whole life of any command.

What ``flock(1)`` does with a file lock, across machines that share only a store: take
the lease on the state ID (busy: exit 3 naming the holder), start the command in a
process group of its own, renew the lease while it runs, release it when the command
ends, and exit with the command's status (128+N when a signal N killed it).

- SIGINT, SIGTERM and SIGHUP are forwarded to the command's process group; the wrapper
  waits for the command and exits with its status.
- A lost lease (broken by ``lock break``, taken over after a stall, the store silent
  past the deadline) stops the command: SIGTERM to its group, SIGKILL after a grace
  that ends before the lease's expiry; the wrapper exits 4 (lease lost).
- Whatever ends the command, every process it started that is still running is stopped
  before the lease is released, and a watcher stops them if the wrapper is killed
  outright (:mod:`mapper_state.warden`).
- The command's environment names the lease (:mod:`mapper_state.core.inherited`): every
  mapper-state inside it that works on this state ID in this store writes under it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

from mapper_state import log, signals, warden
from mapper_state.core import inherited, refusal, state
from mapper_state.core.lease import skew_allowance
from mapper_state.errors import ConfigError, Interrupted, LeaseBusy, LeaseLost, MapperStateError
from mapper_state.modes import runlog
from mapper_state.redact import flag_secrets
from mapper_state.settings import URI_SETTING, Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import StoreError

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The longest a command stopped for a lost lease gets between SIGTERM and SIGKILL.
GRACE_SECONDS = 10.0
#: Shells' statuses for a command that cannot be run.
NOT_EXECUTABLE, NOT_FOUND = 126, 127
USAGE = "mapper-state exec --state-id ID [OPTIONS] -- COMMAND [ARGS]..."
_PR_SET_PDEATHSIG = 1
# Looked up before any fork: the heartbeat thread runs while the command is started, and
# the child must not load anything between fork and exec.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the wrapper dies, even by SIGKILL (Linux), so that no
    command runs on without the lease being renewed."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def status_of(returncode: int) -> int:
    """A process's exit status as a shell gives it: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class Command:
    """The command's process group: started, signalled, waited for, stopped."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.starting = False
        self.received: int | None = None
        self.ended = threading.Event()
        #: Why the wrapper stopped the command, if it did.
        self.stopped: LeaseLost | None = None

    def forward(self, signum: int, frame: object = None) -> None:
        """The signal handler: to the command once it runs; before that, stop the wrapper."""
        self.received = signum
        if self.proc is not None:
            self.signal(signum)
        elif not self.starting:
            raise Interrupted(signum)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def start(self, env: dict[str, str]) -> None:
        self.starting = True  # a signal from now on is for the command
        try:
            self.proc = subprocess.Popen(
                self.argv, env=env, process_group=0, preexec_fn=_die_with_parent
            )
        except OSError as exc:
            code = NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
            raise MapperStateError(
                f"cannot run {self.argv[0]}: {exc.strerror}", exit_code=code
            ) from None
        if self.received is not None:
            self.signal(self.received)

    def wait(self) -> int:
        """Wait for the command; its exit status."""
        assert self.proc is not None
        try:
            return status_of(signals.wait_process(self.proc))
        finally:
            self.ended.set()

    def stop(self, error: LeaseLost, kill_at: float) -> None:
        """The lease is lost: SIGTERM the group, SIGKILL it at ``kill_at`` (wall clock) or
        within :data:`GRACE_SECONDS`, whichever comes first."""
        if self.proc is None or self.ended.is_set():
            return
        self.stopped = error
        self.signal(signal.SIGTERM)
        self.ended.wait(max(0.0, min(GRACE_SECONDS, kill_at - time.time())))
        self.signal(signal.SIGKILL)  # the leader's stragglers too


@contextlib.contextmanager
def forwarding(command: Command) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to the command (or stop the wrapper before it starts)."""
    previous = {s: signal.signal(s, command.forward) for s in FORWARDED}
    try:
        with signals.waking():  # forwarded at once, even when it lands just before the wait
            yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_exec(settings: Settings, argv: list[str]) -> int:
    """Run ``argv`` under the lease on the settings' state ID; return its exit status."""
    if not argv:
        raise ConfigError(f"exec needs a command to run: {USAGE}")
    if not (settings.state_id or "").strip():
        raise ConfigError(f"setting state_id is required for exec (--state-id ID): {USAGE}")
    state_id = state.validate_state_id(settings.state_id)
    store = open_configured_store(settings)
    command = Command(argv)
    secrets = [*settings.secrets(), *flag_secrets(argv)]
    lease = inherited.lease_for(store, state_id, settings, secrets=secrets)
    run_log = runlog.RunLog(settings, "exec", store)  # the run's record in the store
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        stack.enter_context(run_log)  # ended once the lease is released, with the exit status
        stack.enter_context(forwarding(command))
        stack.callback(_release, lease)  # before it is taken: a signal may come right after
        try:
            run_log.acquire(lease)
        except LeaseBusy as exc:  # the same words as a refused run's
            origin = settings.origin(URI_SETTING)
            raise refusal.busy(exc, store, state_id, origin, refusal.RETRY_HINT) from None
        # whatever ends the command, nothing it started runs on once the lease is released
        stack.enter_context(warden.guarding(grace=1.0))
        lease.start_heartbeat(on_lost=lambda error: command.stop(error, _kill_at(lease)))
        held = inherited.HeldLease(
            state_id, lease.run_id, store.display_uri, inherited.EXEC, lease.owner
        )
        command.start(inherited.with_held(held))
        code = command.wait()
        lease.stop_heartbeat()
        if command.stopped is not None:
            raise LeaseLost(
                f"{command.stopped.message}; stopped the command {argv[0]} before the "
                f"lease expired (it exited {code})"
            )
        if command.received is not None:
            log.info(f"forwarded {signal.Signals(command.received).name} to the command")
        run_log.code = code
    return code


def _kill_at(lease: inherited.AnyLease) -> float:
    """When a command stopped for a lost lease must be gone: before the lease's expiry as
    others see it, by half the skew allowance."""
    expires = lease.record.expires_at if lease.record else time.time()
    return expires - skew_allowance(lease.ttl) / 2


def _release(lease: inherited.AnyLease) -> None:
    try:
        lease.release()
    except StoreError as exc:
        log.warning(f"could not release the lease on {lease.state_id}: {exc.message}")
