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
  so a Meltano killed with SIGKILL stops renewing it and it expires after its TTL; a
  normal exit (success, failure, Ctrl-C, Meltano's own SIGTERM handling during a block)
  releases it through :mod:`atexit`. A lease lost meanwhile (``lock break``, a takeover, no
  renewal in time) stops the run: its running plugins get SIGTERM, and Meltano fails it.
- **This run's writes.** The leases are named in the environment as an enclosing run's
  (:mod:`mapper_state.core.inherited`, as ``mapper-state exec`` does): the add-on's own
  state writes in this process, and the mapper plugin Meltano starts, write under them,
  fenced, instead of waiting for them.
- **Busy.** A second run is refused before anything starts, with one line naming the
  holder, exit 3 (``LEASE_BUSY``); it waits first only when ``state_backend.lock_wait_seconds``
  is set (the per-write default of the add-on, 300 s, is not a run's).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mapper_state import log
from mapper_state.core import inherited
from mapper_state.core.lease import Lease
from mapper_state.errors import LeaseLost, MapperStateError
from mapper_state.meltano import backend_schemes, internals
from mapper_state.meltano.env import claim_run_owner
from mapper_state.meltano.refusal import refused
from mapper_state.stores import split_uri

_WAIT = "state_backend.lock_wait_seconds"


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
    leases: list[Lease] = field(default_factory=list)

    def take(self, state_ids: list[str], wait: float) -> None:
        """Take each lease in order (every run takes them in the same order), or none."""
        store, settings = self.manager.store, self.manager.settings
        for state_id in sorted(state_ids):
            lease = inherited.lease_for(store, state_id, settings, owner=claim_run_owner())
            lease.wait = wait
            try:
                lease.acquire()
            except BaseException:
                self.release()
                raise
            self.leases.append(lease)
            lease.start_heartbeat(on_lost=_stop_the_run)
            held = inherited.HeldLease(state_id, lease.run_id, store.display_uri, lease.owner)
            _export(inherited.with_held(held))

    def release(self) -> None:
        for lease in reversed(self.leases):
            try:
                lease.release()
            except MapperStateError as exc:
                log.warning(f"could not release the lease on {lease.state_id}: {exc.message}")
        self.leases.clear()

    def close(self) -> None:
        self.release()
        with contextlib.suppress(Exception):
            self.manager.close()


def _export(env: Mapping[str, str]) -> None:
    os.environ[inherited.HELD_LEASE_VAR] = env[inherited.HELD_LEASE_VAR]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``; none elsewhere)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry))
    return found


def _stop_the_run(error: LeaseLost) -> None:
    """The lease is gone (broken, taken over, not renewed in time): stop what the run is
    running (its plugins, Meltano's children) with SIGTERM, so that no step goes on
    unguarded while another run may hold the lease; Meltano then fails the run, and its
    next state write would be refused anyway."""
    children = _children(os.getpid())
    log.error(f"{error.message}: stopping this run ({len(children)} running plugin processes)")
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _wait_seconds(settings: Any) -> float:
    """``lock_wait_seconds`` as set by the user; 0 (refuse at once) when left to its default."""
    if settings.sources.get(_WAIT) == "default":
        return 0.0
    return float(settings.lock_wait)


def _uses_the_addon(project: Any) -> bool:
    uri = str(project.settings.get("state_backend.uri") or "")
    return split_uri(uri)[0] in backend_schemes.schemes()


def hold_for_run(command: str, params: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    """Take the leases of the run about to start, or exit 3 naming the holder."""
    project = obj.get("project")
    if project is None or not _uses_the_addon(project):
        return
    state_ids = planned_state_ids(command, params, project)
    if not state_ids:
        return
    manager_of = internals.lookup(
        "meltano.core.state_store:state_store_manager_from_project_settings"
    )
    try:
        manager = manager_of(project.settings)
    except MapperStateError as exc:
        raise refused(exc) from None
    run = RunLeases(manager)
    try:
        run.take(state_ids, _wait_seconds(manager.settings))
    except MapperStateError as exc:
        run.close()
        raise refused(exc) from None
    atexit.register(run.close)
    log.info(
        f"holding the lease on {', '.join(sorted(state_ids))} until Meltano exits",
        run_id=run.leases[0].run_id if run.leases else "",
    )
