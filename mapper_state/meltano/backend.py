"""Meltano's state backend add-on: ``meltano run`` and ``meltano state`` write through the lease.

Meltano loads :class:`MapperStateBackend` through the ``meltano.state_backends`` entry points
(one per store, see :mod:`mapper_state.meltano.backend_schemes`) when ``state_backend.uri``
is ``mapper-state+<store>://...``. Its methods are thin calls into the domain:

- ``acquire_lock`` is the lease (atomic create, TTL, renewed by a heartbeat, released on
  exit, the holder recorded), waiting for a busy one every ``retry_seconds`` up to
  ``state_backend.lock_wait_seconds``, then an error naming the holder;
- ``set`` writes under the lease, fenced: the lease is confirmed, then ``state.json`` is
  replaced only at the version read under it; the empty-state guard applies, every write
  has unique bytes and a history snapshot (so ``mapper-state state rollback`` undoes a bad
  ``meltano run`` or ``meltano state clear``);
- the layout is the one Meltano's own file, S3, GCS and Azure backends keep
  (``<prefix>/<state_id>/state.json``), so each reads what the other wrote; their leftover
  ``lock`` objects are neither states nor locks here.

The ``meltano`` package is imported here only, and only when Meltano loads the entry point.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from meltano.core.error import MeltanoError
from meltano.core.state_store.base import MeltanoState, StateStoreManager

from mapper_state import log
from mapper_state.config import load_settings
from mapper_state.core import commit, history, inherited, state
from mapper_state.core.lease import Lease, LeaseRecord, is_held_by, lost_to, read_lease
from mapper_state.core.state import singer_state
from mapper_state.errors import BadInput, LeaseBusy, LeaseLost, MapperStateError
from mapper_state.meltano import backend_schemes, run_hook
from mapper_state.meltano.env import SOURCE, claim_run_owner
from mapper_state.meltano.refusal import (  # noqa: F401 - Refused, in_addon_words: the add-on's words
    Refused,
    errors_as_meltano,
    in_addon_words,
    install_hint,
)
from mapper_state.settings import Settings, coerce
from mapper_state.stores import open_configured_store, split_uri
from mapper_state.stores.base import BlobStore, listing

#: What the history records as the writer of a Meltano command's state.
NOTE = "meltano"


class BackendError(MeltanoError):  # type: ignore[misc]
    """A mapper-state error as Meltano shows it: one line, no traceback."""

    def __init__(self, message: str, instruction: str | None = None) -> None:
        super().__init__(message, instruction)


def check_meltano_version(found: str | None) -> None:
    """Refuse a Meltano older than :data:`backend_schemes.MINIMUM_MELTANO`, saying which is needed."""
    needed = ".".join(map(str, backend_schemes.MINIMUM_MELTANO))
    try:
        parts = tuple(int(p) for p in (found or "0").split(".")[:2])
    except ValueError:
        return  # a development build: let it try
    if parts < backend_schemes.MINIMUM_MELTANO:
        raise BackendError(
            f"mapper-state's state backend needs Meltano {needed} or newer (found {found})",
            f"upgrade Meltano: pip install 'meltano>={needed}'",
        )


def _installed_meltano() -> str | None:
    try:
        return version("meltano")
    except PackageNotFoundError:
        return None


def _project_root() -> str:
    """The root of the Meltano project this Meltano process found (the cwd outside one)."""
    from meltano.core.project import Project, ProjectNotFound

    try:
        return str(Project.find().root)
    except ProjectNotFound:
        return os.getcwd()


def resolve_settings(
    kwargs: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    wait_default: float = backend_schemes.WRITE_WAIT_DEFAULT_SECONDS,
) -> Settings:
    """mapper-state's settings from Meltano's keyword arguments, then ``MAPPER_STATE_*``, then
    ``MELTANO_STATE_BACKEND_*`` (the store's own names), then the defaults; each SDK reads its
    own environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_*``, ``PG*``) as usual.
    ``lock_wait_seconds`` not set is ``wait_default``: a state write's, or a whole run's.
    """
    env = os.environ if env is None else env
    uri = str(kwargs.get("uri") or "")
    scheme = split_uri(uri)[0]
    store = backend_schemes.schemes().get(scheme)
    if store is None:
        raise BackendError(f"state_backend.uri {uri} is not a mapper-state scheme")
    flags: dict[str, Any] = {"state_backend.uri": backend_schemes.store_uri(uri)}
    for name in ("lock_timeout_seconds", "lock_retry_seconds", "lock_wait_seconds"):
        flags[f"state_backend.{name}"] = kwargs.get(name)
    for spec in backend_schemes.scheme_settings(store):
        short = spec.name.rsplit(".", 1)[1]
        flags[backend_schemes.ours(store, short)] = kwargs.get(short)
    env = {k: v for k, v in env.items() if k != "MELTANO_STATE_BACKEND_URI"}
    # a relative mapper-state+file:// path is the project's, as for the mapper plugin,
    # whichever directory of the project `meltano` was started in
    env.setdefault("MELTANO_PROJECT_ROOT", _project_root())
    wait = {backend_schemes.LOCK_WAIT.name: wait_default}
    settings = load_settings(flags, env=env, sources=[SOURCE], defaults=wait)
    values = dict(settings.values)
    # Meltano's default lock timeout (10 s) would leave each request a 3 s retry deadline
    ttl = backend_schemes.floored_ttl(settings.lock_timeout)
    values["state_backend.lock_timeout_seconds"] = ttl
    return Settings(values, settings.sources, settings.secret_names, settings.other_secrets)


@dataclass
class RunLease:
    """The lease of the ``meltano run`` this process is: its whole-run lease's, its mapper's,
    or its keeper's, recognised by the run's owner token (:func:`claim_run_owner`).

    Meltano's own state writes in that run go through under it (one lease per run) rather
    than wait for it. They are fenced by checking that the run still holds it, then by the
    conditional write; the holder keeps renewing it (renewing it here would make the
    holder's next compare-and-swap fail).
    """

    store: BlobStore
    state_id: str
    run_id: str
    command: str
    owner: str = field(default="")

    def confirm(self) -> None:
        holder, _ = read_lease(self.store, self.state_id)
        if not is_held_by(holder, self.owner, time.time()):
            raise LeaseLost(
                f"the lease of this run on {self.state_id} is gone or about to expire "
                f"({lost_to(holder, self.run_id)}); not writing"
            )


def is_this_run(holder: LeaseRecord | None) -> bool:
    """Is the lease held for this Meltano process's run: by itself (the whole-run lease of
    :mod:`mapper_state.meltano.run_lease`), by its mapper, or by the keeper it left? All
    carry the run's owner token."""
    return is_held_by(holder, claim_run_owner())


class MapperStateBackend(StateStoreManager):  # type: ignore[misc]
    """Meltano's ``StateStoreManager`` over a mapper-state store."""

    def __init__(self, **kwargs: Any) -> None:
        check_meltano_version(_installed_meltano())
        super().__init__(**kwargs)
        #: Meltano's keyword arguments, as given.
        self.given = dict(kwargs)
        with errors_as_meltano():
            require = coerce(
                backend_schemes.REQUIRE_RUN_LEASE, kwargs.get("require_run_lease"), "Meltano"
            )
            run_hook.check_guarded(meltano_command(), bool(require))
            self.owner = claim_run_owner()
            self.settings = resolve_settings(kwargs)
            self.store: BlobStore = open_configured_store(self.settings)
        #: The leases this process holds, and the version of each state read under them.
        self._leases: dict[str, inherited.AnyLease | RunLease] = {}
        self._seen: dict[str, state.StateSnapshot] = {}

    @property
    def label(self) -> str:
        return f"mapper-state {self.store.display_uri}"

    @functools.cached_property
    def run_wait(self) -> float:
        """What a whole ``meltano run`` waits for a busy lease (:mod:`.run_lease`):
        ``lock_wait_seconds`` as set, else :data:`~.backend_schemes.RUN_WAIT_DEFAULT_SECONDS`."""
        wait = backend_schemes.RUN_WAIT_DEFAULT_SECONDS
        return resolve_settings(self.given, wait_default=wait).lock_wait

    # -- reading -----------------------------------------------------------------------
    def get(self, state_id: str) -> MeltanoState | None:
        with errors_as_meltano():
            snapshot = state.load(self.store, state_id)
        if state_id in self._leases:
            self._seen[state_id] = snapshot
        if not snapshot.exists:
            return None
        doc = snapshot.document or {}
        return MeltanoState(  # as Meltano's own backends read a document (MeltanoState.from_json)
            state_id=state_id,
            completed_state=doc.get("completed", {}),
            partial_state=doc.get("partial", {}),
        )

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        """One listing of the store (the history's prefix skipped), whatever the pattern."""
        prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0] if pattern else ""
        suffix = "/" + state.STATE_FILE
        with errors_as_meltano():
            keys = [e.key for e in listing(self.store, prefix, exclude=history.HISTORY_ROOT)]
        found = (key.removesuffix(suffix) for key in keys if key.endswith(suffix))
        ids = sorted(
            i
            for i in found
            if not i.startswith(state.RESERVED_PREFIX)
            and (not pattern or fnmatch.fnmatchcase(i, pattern))
        )
        if not ids and meltano_command() == ["state", "list"]:  # say which store was listed
            matching = f" matching {pattern}" if pattern else ""
            log.warning(f"no states{matching} in mapper-state {self.store.display_uri}")
        return ids

    # -- the lease -----------------------------------------------------------------------
    @contextlib.contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        if state_id in self._leases:  # already ours (a write inside Meltano's own lock)
            yield
            return
        with errors_as_meltano():
            state.validate_state_id(state_id)
            lease = inherited.lease_for(self.store, state_id, self.settings)  # exec's, or ours
            lease.retry = retry_seconds or lease.retry
            holder = lease.try_acquire()
            if holder is not None and is_this_run(holder):  # this run's own lease
                yield from self._under_the_run(state_id, holder)
                return
            if holder is not None:  # another run's: wait for it as any holder waits
                lease.wait = self.settings.lock_wait
                lease.acquire()
            lease.start_heartbeat()
        self._leases[state_id] = lease
        try:
            yield
        finally:
            self._leases.pop(state_id, None)
            self._seen.pop(state_id, None)
            with errors_as_meltano():
                lease.release()

    def _under_the_run(self, state_id: str, holder: LeaseRecord) -> Iterator[None]:
        self._leases[state_id] = RunLease(
            self.store, state_id, holder.run_id, holder.command, holder.owner_token
        )
        try:
            yield
        finally:
            self._leases.pop(state_id, None)
            self._seen.pop(state_id, None)

    @contextlib.contextmanager
    def _held(self, state_id: str) -> Iterator[inherited.AnyLease | RunLease]:
        """The lease on ``state_id``: the one held, else one taken for this write alone."""
        with self.acquire_lock(state_id, retry_seconds=self.settings.lock_retry):
            yield self._leases[state_id]

    # -- writing -------------------------------------------------------------------------
    def set(self, meltano_state: MeltanoState) -> None:
        state_id = meltano_state.state_id
        with self._held(state_id) as lease, errors_as_meltano():
            self._write(lease, state_id, document_of(meltano_state), explicit=operator_write())

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        """``meltano state import``: every state ID and lease checked before the first write;
        a write refused after that says which states were written and which were not."""
        pending = list(states)
        with errors_as_meltano():
            for each in pending:
                state.validate_state_id(each.state_id)
            for each in pending:
                self._check_free(each.state_id)
        written: list[str] = []
        try:
            for each in pending:
                self.set(each)
                written.append(each.state_id)
        except BaseException:
            left = [s.state_id for s in pending[len(written) :]]
            log.error(
                f"wrote {len(written)} of {len(pending)} states"
                + (f" ({', '.join(written)})" if written else "")
                + f"; not written: {', '.join(left)}"
            )
            raise
        return len(written)

    def _check_free(self, state_id: str) -> None:
        """Refuse at once a state ID whose lease another run holds (nothing written yet)."""
        if state_id in self._leases or inherited.held_here(self.store, state_id):
            return  # ours, or an enclosing run's (its write is fenced when it happens)
        holder, _ = read_lease(self.store, state_id)
        if holder is not None and holder.held and not is_this_run(holder):
            raise LeaseBusy(
                f"state ID {state_id} is busy: {holder.describe()}; no state was written"
            )

    def _write(
        self,
        lease: inherited.AnyLease | RunLease,
        state_id: str,
        document: dict[str, Any],
        *,
        explicit: bool,
    ) -> None:
        """Write Meltano's ``document`` under ``lease`` through the commit path. An
        ``explicit`` write (a ``meltano state`` command) is written as given; a run's passes
        the empty-state guard first (dropped streams kept in the ``completed`` half)."""
        prior = self._seen.get(state_id) or state.load(self.store, state_id)
        try:
            value = singer_state(document)
        except ValueError as exc:
            raise BadInput(
                f"the state given for {state_id} is not a Meltano state: {exc}"
            ) from None
        options = commit.Options(
            note=NOTE,
            history_keep=self.settings.history_keep,
            run_write=not explicit,
            allow_reset=self.settings.allow_state_reset,
            # a state Meltano wrote, or one an operator replaces: keep it undoable
            keep_prior=explicit or prior.writer.run_id is None,
        )
        outcome = commit.commit(self.store, lease, prior, value, options, document=document)
        if outcome.refused:
            reason = outcome.verdict.warning or f"refused to replace the bookmarks of {state_id}"
            raise BadInput(
                f"{reason} (set allow_state_reset, or `meltano state clear` the state first)"
            )
        if outcome.verdict.warning:
            log.warning(outcome.verdict.warning)
        self._seen[state_id] = outcome.stored

    def delete(self, state_id: str) -> None:
        """``meltano state clear``: through the commit path (the prior state kept in the
        history, the lease confirmed, the delete conditional on the version read, with the
        fallback of a store that refuses conditional deletes); a state another writer
        changed after that read is refused as a lost lease, as a ``set`` is."""
        with self._held(state_id) as lease, errors_as_meltano():
            prior = self._seen.get(state_id) or state.load(self.store, state_id)
            if not prior.exists:
                return
            options = commit.Options(
                note=NOTE, history_keep=self.settings.history_keep, keep_prior=True
            )
            commit.remove(self.store, lease, prior, options)
            self._seen.pop(state_id, None)

    def migrate(self) -> None:
        """Move what older mapper-state versions left (``<id>/history/``) to today's layout."""
        with errors_as_meltano():
            moved = history.migrate_legacy(self.store)
        snapshots = "1 history snapshot" if moved == 1 else f"{moved} history snapshots"
        log.info(
            f"mapper-state {self.store.display_uri}: moved {snapshots} to {history.HISTORY_ROOT}"
        )

    def close(self) -> None:
        for lease in list(self._leases.values()):
            if isinstance(lease, Lease):  # a run's lease is its holder's to release
                with contextlib.suppress(MapperStateError):
                    lease.release()
        self._leases.clear()
        self.store.close()


def document_of(meltano_state: MeltanoState) -> dict[str, Any]:
    """Meltano's document for a state, its two halves as Meltano gives them."""
    return {"completed": meltano_state.completed_state, "partial": meltano_state.partial_state}


#: The ``meltano`` commands whose state writes are an operator's explicit word.
OPERATOR_GROUP = "state"


def operator_write() -> bool:
    """Is this write a ``meltano state ...`` command's (``set``, ``edit``, ``merge``, ``copy``,
    ``move``, ``import``)? Those write what the operator said, as Meltano's own backends do
    (the prior state stays in the history); any other write (``meltano run``, ``el``,
    ``elt``, a library call) is a run's, and passes the empty-state guard.
    """
    return meltano_command()[:1] == [OPERATOR_GROUP]


def meltano_command() -> list[str]:
    """The ``meltano`` subcommand running (``["state", "set"]``), from click's context; ``[]``
    outside a command."""
    import click

    ctx = click.get_current_context(silent=True)
    return [] if ctx is None else ctx.command_path.split()[1:]
