"""The lease of a whole ``meltano run`` (``el``, ``elt``) with only the state backend add-on.

Meltano's per-write ``acquire_lock`` guards one state write, not a run: two ``meltano run``
of one pipeline on two machines sharing a bucket both run and load every row twice, and
Meltano's own duplicate-run check lives in each machine's system database. This module
gives such a run the lease on each of its state IDs from before anything of the run starts
until Meltano exits, with ``state_backend.uri: mapper-state+<store>://...`` as the only change.

How, in Meltano 3.7 to 4.4 (read in their ``meltano.cli``, ``meltano.core.block`` and
``meltano.core.state_store``):

- **When.** :mod:`mapper_state.meltano.run_hook` calls :func:`hold_for_run` once the
  subcommand's options are parsed and its environment activated, before Meltano installs,
  discovers or starts any plugin (or says why it cannot, on a Meltano whose internals
  moved: :mod:`mapper_state.meltano.internals`).
- **Which state IDs.** ``run``: the IDs Meltano's own block parser gives each extract-load
  block (``<environment>:<extractor>-to-<loader>`` and the suffix of
  ``--state-id-suffix`` or of the environment; jobs expanded); ``el``/``elt``: ``--state-id``.
  None (and no lease) for a dry run, ``--no-state-update``, ``--dump``, ``--only-install``,
  a run without an environment, or ``el`` without ``--state-id`` (Meltano then uses an
  ephemeral ID that no other run shares).
- **Which store.** The state store manager Meltano itself makes from the project's
  settings: the add-on's, the same store and settings as the run's state writes.
- **Holding it.** Each lease is renewed by a heartbeat thread of the Meltano process itself,
  so a Meltano killed with SIGKILL stops renewing it and it expires after its TTL, and a
  watcher (:mod:`mapper_state.warden`) stops every process of the run meanwhile; a normal
  exit (success, failure, Ctrl-C, Meltano's own SIGTERM handling during a block) stops what
  is left of the run and releases it through :mod:`atexit`; SIGTERM at any other moment
  (a utility or dbt step) stops the run's processes, releases it and exits 143. A lease
  lost meanwhile (a takeover, no renewal in time) stops the run: every process it started
  gets SIGTERM (SIGKILL before the lease expires), and Meltano exits 4. A lease an operator
  broke (``lock break``, not ``--force``) stays this run's until its renewal deadline
  (``free_at``): the run's extractors are stopped first, and the loader is left to load
  what it was sent and confirm it, which Meltano writes as the state under the lease
  winding down, so that the next run resumes after every row this one loaded; whatever
  still runs near that deadline is stopped, and Meltano exits 4.
- **This run's writes.** The leases are named in the environment as an enclosing run's
  (:mod:`mapper_state.core.inherited`, as ``mapper-state exec`` does): the add-on's own
  state writes in this process, and the mapper plugin Meltano starts, write under them,
  fenced, instead of waiting for them.
- **Busy.** A second run is refused before anything starts, with one line naming the
  holder, exit 3 (``LEASE_BUSY``); it waits first only when ``state_backend.lock_wait_seconds``
  is set (:data:`~mapper_state.meltano.backend_schemes.RUN_WAIT_DEFAULT_SECONDS`; the
  per-write default of the add-on, 300 s, is not a run's).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mapper_state import log, runtime
from mapper_state.core import inherited, refusal
from mapper_state.core.lease import format_time, skew_allowance
from mapper_state.core.recorder import RunRecorder
from mapper_state.errors import ExitCode, LeaseBroken, LeaseBusy, LeaseLost, MapperStateError
from mapper_state.meltano import backend_schemes, internals
from mapper_state.meltano.env import claim_run_owner
from mapper_state.meltano.refusal import refused
from mapper_state.settings import URI_SETTING
from mapper_state.stores import split_uri
from mapper_state.warden import GRACE_SECONDS, Warden, process_table, stop

#: Marks Meltano's SIGTERM handling once wrapped (:func:`_stop_on_sigterm`).
_SIGTERM_ARMED = "_mapper_state_sigterm"
#: Marks Meltano's plugin invocation once wrapped (:func:`_track_extractors`).
_INVOKE_ARMED = "_mapper_state_invoke"


def exit_if_lost(run: RunLeases | None) -> None:
    """A run whose lease was lost exits 4 (lease lost), as ``run`` and ``exec`` do, whatever
    Meltano made of its stopped steps."""
    if run is not None and run.lost is not None:
        log.error(f"{run.lost.message}; the run was stopped (exit {int(ExitCode.LEASE_LOST)})")
        raise SystemExit(int(ExitCode.LEASE_LOST))


# -- which state IDs ----------------------------------------------------------------------


def _only_install(params: Mapping[str, Any]) -> bool:
    exits = internals.lookup("meltano.cli.params:_install_plugins_and_exit")
    action = params.get("install_plugins")
    return action is exits or getattr(action, "__name__", "") == exits.__name__


def planned_state_ids(command: str, params: Mapping[str, Any], project: Any) -> list[str]:
    """The state IDs a Meltano ``run``/``el``/``elt`` with these options will read and write."""
    if _only_install(params):
        return []
    if command == "run":
        if params.get("dry_run") or params.get("no_state_update") or not project.environment:
            return []
        return _run_state_ids(project, params)
    if params.get("dry") or params.get("dump"):
        return []
    state_id = params.get("state_id")
    return [str(state_id)] if state_id else []


class _Quiet:
    """A logger for Meltano's block parser that says nothing: Meltano's own parse says it."""

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return lambda *_args, **_kwargs: None


def _run_state_ids(project: Any, params: Mapping[str, Any]) -> list[str]:
    """Meltano's own parse of the blocks; nothing when it fails (Meltano then says why).

    The parse reads plugin settings from the system database, so the database is set up
    first, as the command itself does next (a no-op then).
    """
    block_parser = internals.lookup("meltano.core.block.block_parser:BlockParser")
    extract_load = internals.lookup("meltano.core.block.extract_load:ExtractLoadBlocks")
    project_engine = internals.lookup("meltano.core.db:project_engine")
    migrations = internals.lookup("meltano.core.migration_service:MigrationService")
    try:
        # what the command does first (`pass_project(migrate=True)`), here a moment earlier:
        # the block parser reads plugin settings from the system database, new in a container
        engine, _ = project_engine(project, default=True)
        migrations(engine).upgrade(silent=True)
        parser = block_parser(
            _Quiet(),
            project,
            list(params.get("blocks") or ()),
            full_refresh=bool(params.get("full_refresh")),
            no_state_update=False,
            state_id_suffix=params.get("state_id_suffix"),
            run_id=params.get("run_id"),
        )
        blocks = list(parser.find_blocks(0))
    except Exception as exc:  # noqa: BLE001 - Meltano's own parse of the same blocks reports it
        log.warning(f"no whole-run lease: the run's blocks could not be read ({exc})")
        return []
    found = (b.context.job for b in blocks if isinstance(b, extract_load))
    return sorted({job.job_name for job in found if job is not None})


# -- holding the leases --------------------------------------------------------------------


@dataclass
class RunLeases:
    """The leases a Meltano process holds for its run, released when it exits."""

    manager: Any  #: the add-on's state store manager, whose store holds the leases
    leases: list[inherited.AnyLease] = field(default_factory=list)
    #: Each lease's run record in the store (:mod:`mapper_state.core.recorder`).
    recorders: list[RunRecorder] = field(default_factory=list)
    #: Stops the run's processes (its plugins and theirs) before a lease is released.
    warden: Warden | None = None
    #: The first loss of a lease, if one was lost: the run then exits 4 (lease lost).
    lost: LeaseLost | None = None
    #: The run's extractor processes, as Meltano started them: ``pid -> start time``.
    extractors: dict[int, int] = field(default_factory=dict)

    @property
    def owned(self) -> list[inherited.AnyLease]:
        """The leases this process holds itself (not an enclosing run's)."""
        return [lease for lease in self.leases if not isinstance(lease, inherited.InheritedLease)]

    def take(self, state_ids: list[str], wait: float) -> None:
        """Take each lease in order (every run takes them in the same order), or none."""
        store, settings = self.manager.store, self.manager.settings
        for state_id in sorted(state_ids):
            lease = inherited.lease_for(store, state_id, settings, owner=claim_run_owner())
            lease.wait = wait
            recorder = RunRecorder(store, keep=settings.runs_keep, mode="meltano", waits=wait > 0)
            try:
                recorder.acquire(lease)
            except LeaseBusy as exc:
                self.release()
                origin = settings.origin(URI_SETTING)
                raise refusal.busy(exc, store, state_id, origin, "") from None
            except BaseException:
                self.release()
                raise
            self.recorders.append(recorder)
            self.leases.append(lease)
            if isinstance(lease, inherited.InheritedLease):
                continue  # the enclosing run holds it, renews it and names it already
            lease.start_heartbeat(on_lost=self._stop_the_run)
            held = inherited.HeldLease(
                state_id, lease.run_id, store.display_uri, inherited.MELTANO_RUN, lease.owner
            )
            _export(inherited.with_held(held))

    def _stop_the_run(self, error: LeaseLost) -> None:
        """The lease is gone (broken, taken over, not renewed in time): stop everything the
        run is running (its plugins and what they started) before the lease expires, so
        that no step goes on unguarded while another run may hold the lease; Meltano then
        fails the run, which exits 4 (lease lost)."""
        self.lost = self.lost or error
        running = self.warden.running() if self.warden else {}
        taps = {pid: started for pid, started in self.extractors.items() if pid in running}
        until = self._winding_down_until(error)
        if self.warden is not None and taps and until is not None:
            self._wind_down(taps, running, until, error)
            return
        log.error(f"{error.message}: stopping this run ({len(running)} running processes)")
        if self.warden is not None:
            self.warden.stop_all(grace=_grace(self.leases))

    def _winding_down_until(self, error: LeaseLost) -> float | None:
        """For a lease an operator broke (not forced): the moment (epoch seconds) by which
        the run must have stopped, leaving its steps a grace before the lease's winding
        down ends; ``None`` for any other loss, or too little time left."""
        if not isinstance(error, LeaseBroken) or error.free_at is None:
            return None
        ttl = min(lease.ttl for lease in self.leases)
        until = error.free_at - skew_allowance(ttl) - _grace(self.leases)
        return until if until > runtime.now() else None

    def _wind_down(
        self, taps: dict[int, int], running: dict[int, int], until: float, error: LeaseLost
    ) -> None:
        """Stop the extractors; let the loader finish what it was sent (Meltano writes the
        state it confirms, under the lease winding down) until ``until``; then stop
        whatever is left, and anything started meanwhile."""
        assert self.warden is not None
        log.error(
            f"{error.message}: stopping this run's extractor; its loader may finish loading "
            f"what it was sent, and its state is kept, until {format_time(until)}"
        )
        grace = _grace(self.leases)
        stop(taps, grace, roots=list(taps))
        others = {pid: started for pid, started in running.items() if pid not in taps}
        while runtime.now() < until and _any_alive(others):
            runtime.sleep(0.1)
        left = self.warden.stop_all(grace=grace)
        if left:
            log.error(f"stopped {left} processes of this run still running at {format_time(until)}")

    def note_invoked(self, plugin_type: str, pid: int) -> None:
        """Meltano started a plugin of ``plugin_type`` as process ``pid``."""
        if plugin_type == "extractors":
            started = process_table().get(pid)
            if started is not None:
                self.extractors[pid] = started[1]

    def ended(self, code: int) -> None:
        """Meltano's command ended with exit status ``code``: end every run record."""
        for recorder in self.recorders:
            recorder.end(code)

    def release(self) -> None:
        if self.warden is not None and self.owned:
            self.warden.stop_all(grace=_grace(self.leases))
        for lease in reversed(self.leases):
            try:
                lease.release()
            except MapperStateError as exc:
                log.warning(f"could not release the lease on {lease.state_id}: {exc.message}")
        self.leases.clear()
        if self.warden is not None:
            self.warden.close()
            self.warden = None

    def close(self) -> None:
        self.release()
        with contextlib.suppress(Exception):
            self.manager.close()

    def on_sigterm(self, signum: int, frame: object) -> None:
        """SIGTERM outside Meltano's own handling of it (a utility or dbt step, the plugins'
        installation): stop the run's processes, release the leases at once, exit 143."""
        log.error(
            f"interrupted by {signal.Signals(signum).name}: stopping this run and releasing "
            f"the lease on {', '.join(lease.state_id for lease in self.owned)}"
        )
        self.ended(128 + signum)
        self.close()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(128 + signum)


def _any_alive(known: Mapping[int, int]) -> bool:
    """Does any of ``known`` (``pid -> start time``) still run as itself?"""
    table = process_table()
    return any(
        pid in table and table[pid][1] == started and table[pid][2] not in ("Z", "X")
        for pid, started in known.items()
    )


def _track_extractors(run: RunLeases) -> None:
    """Tell ``run`` the pid of each extractor Meltano starts (``PluginInvoker.invoke_async``),
    so that a broken lease stops those first (:meth:`RunLeases._wind_down`)."""
    invoker = internals.lookup("meltano.core.plugin_invoker:PluginInvoker")
    own = invoker.invoke_async
    if getattr(own, _INVOKE_ARMED, False):
        return

    @functools.wraps(own)
    async def invoke_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        process = await own(self, *args, **kwargs)
        with contextlib.suppress(Exception):  # never in the way of Meltano's own call
            run.note_invoked(str(getattr(self.plugin.type, "value", self.plugin.type)), process.pid)
        return process

    setattr(invoke_async, _INVOKE_ARMED, True)
    invoker.invoke_async = invoke_async


def _grace(leases: list[inherited.AnyLease]) -> float:
    """How long stopped steps get before SIGKILL: a third of the shortest TTL, at most 5 s."""
    return min([GRACE_SECONDS, *(lease.ttl / 3 for lease in leases)])


def _export(env: Mapping[str, str]) -> None:
    os.environ[inherited.HELD_LEASE_VAR] = env[inherited.HELD_LEASE_VAR]


def _uses_the_addon(project: Any) -> bool:
    uri = str(project.settings.get("state_backend.uri") or "")
    return split_uri(uri)[0] in backend_schemes.schemes()


def hold_for_run(
    command: str, params: Mapping[str, Any], obj: Mapping[str, Any]
) -> RunLeases | None:
    """Take the leases of the run about to start, or exit 3 naming the holder."""
    project = obj.get("project")
    if project is None or not _uses_the_addon(project):
        return None
    state_ids = planned_state_ids(command, params, project)
    if not state_ids:
        return None
    manager_of = internals.lookup(
        "meltano.core.state_store:state_store_manager_from_project_settings"
    )
    try:
        manager = manager_of(project.settings)
    except MapperStateError as exc:
        raise refused(exc) from None
    run = RunLeases(manager)
    try:
        run.take(state_ids, manager.run_wait)
    except MapperStateError as exc:
        run.close()
        raise refused(exc) from None
    atexit.register(run.close)
    ids = ", ".join(sorted(state_ids))
    where = manager.store.display_uri
    if not run.owned:  # inside `mapper-state exec` (or another enclosing run) on these IDs
        first = run.leases[0] if run.leases else None
        enclosing = first.held if isinstance(first, inherited.InheritedLease) else None
        whose = enclosing.described() if enclosing is not None else "the enclosing run"
        log.info(f"running under the lease on {ids} in {where} of the enclosing {whose}")
        return run
    run.warden = Warden.start()
    _stop_on_sigterm(run)
    _track_extractors(run)
    log.info(
        f"holding the lease on {ids} in {where} until Meltano exits",
        run_id=run.leases[0].run_id if run.leases else "",
    )
    return run


def _stop_on_sigterm(run: RunLeases) -> None:
    """SIGTERM stops the run and releases its leases at once (:meth:`RunLeases.on_sigterm`),
    also after an extract-load block: Meltano handles SIGTERM itself during such a block
    (it stops the plugins and fails the job), and leaves the default action (the process
    dies, its steps run on) behind it; so the handler is put back after each block."""
    signal.signal(signal.SIGTERM, run.on_sigterm)
    with contextlib.suppress(ImportError, AttributeError):
        from meltano.core.job.job import Job

        own = Job._handling_sigterm
        if getattr(own, _SIGTERM_ARMED, False):
            return

        @contextlib.contextmanager
        def handling_sigterm(self: Any, session: Any) -> Iterator[None]:
            try:
                with own(self, session):
                    yield
            finally:
                signal.signal(signal.SIGTERM, run.on_sigterm)

        setattr(handling_sigterm, _SIGTERM_ARMED, True)
        Job._handling_sigterm = handling_sigterm
