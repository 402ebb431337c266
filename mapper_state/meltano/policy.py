"""Meltano's rules for a run: lock-only on Meltano's own state, the handed-state check, the missing ID.

Meltano reads ``state.json`` before it starts any plugin, hands it to the tap in
``<MELTANO_SYS_DIR_ROOT>/run/<extractor>/state.json`` and writes the state the target
confirms after the mapper has exited. Hence, in a mapping run:

- when mapper-state's store and ID are the ones Meltano writes
  (:func:`meltano_owns_state`) it only guards the run (``lock_only``);
- after a successful run the lease is handed to a small keeper process that holds it
  until Meltano itself exits (after its final state write), see :mod:`mapper_state.meltano.keeper`;
- after taking the lease it checks that the state Meltano handed the tap is still the
  stored one (:func:`check_handed_state`): if another run finished in between, this run
  would start from a stale bookmark.

:class:`MeltanoHooks` hands these rules to the core's session
(:class:`mapper_state.core.session.RunHooks`); the core knows nothing of Meltano.
"""

from __future__ import annotations

from collections.abc import Mapping

from mapper_state import jsonio, log
from mapper_state.core import inherited
from mapper_state.core.lease import Lease
from mapper_state.core.session import RunHooks
from mapper_state.core.state import StateSnapshot
from mapper_state.errors import ConfigError, LeaseLost
from mapper_state.meltano import keeper
from mapper_state.meltano.env import (
    BACKEND_URI_VAR,
    MELTANO_LAYOUT_SCHEMES,
    SYSTEMDB,
    MeltanoRun,
    environment,
    from_meltano_uri,
    store_identity,
)
from mapper_state.settings import Settings
from mapper_state.stores import split_uri


def meltano_owns_state(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """Is mapper-state's state the one Meltano writes (same store, Meltano's state ID)?

    Meltano's ID is ``<environment>:<extractor>-to-<loader>``; the loader is not known
    to a mapper, so any ID with this run's ``<environment>:<extractor>-to-`` prefix counts.
    """
    env = environment(env)
    run = MeltanoRun.from_env(env)
    meltano_uri = env.get(BACKEND_URI_VAR, "").strip()
    if run is None or not meltano_uri or meltano_uri.lower() == SYSTEMDB:
        return False
    prefix = run.state_id_prefix()
    if not (prefix and settings.state_id and settings.state_id.startswith(prefix)):
        return False
    try:
        meltanos = from_meltano_uri(meltano_uri)
    except ConfigError:
        return False  # a URI Meltano cannot use: it keeps no state there
    if split_uri(meltanos)[0] not in MELTANO_LAYOUT_SCHEMES:
        return False  # a state-backend plugin's own layout: Meltano's state is not ours
    return store_identity(meltanos) == store_identity(settings.uri)


def lock_only(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """The ``lock_only`` setting, defaulting to :func:`meltano_owns_state`."""
    explicit = settings.lock_only
    owned = meltano_owns_state(settings, env)
    if explicit is None:
        return owned  # said once the lease is held (MeltanoHooks.check_prior), not before
    if owned and not explicit:
        log.warning(
            f"lock_only is off but {settings.state_id} in this store is Meltano's own state: "
            "both will write it, and a state Meltano writes during the run makes mapper-state's "
            "next write fail; leave lock_only unset to let Meltano write it alone"
        )
    return bool(explicit)


def missing_state_id(env: Mapping[str, str] | None = None) -> ConfigError | None:
    """In a Meltano mapping without ``state_id``: the error saying what to add to meltano.yml."""
    run = MeltanoRun.from_env(env)
    if run is None:
        return None
    prefix = run.state_id_prefix() or "<environment>:<extractor>-to-"
    yaml = "\n".join(
        (
            "plugins:",
            "  mappers:",
            f"  - name: {run.mapper or '<this mapper>'}",
            "    mappings:",
            f"    - name: {run.mapping}",
            "      config:",
            f"        state_id: {prefix}<loader>",
        )
    )
    return ConfigError(
        f"setting state_id is missing in the Meltano mapping {run.mapping}; add it to "
        "meltano.yml as below, with your loader's name (Meltano does not tell a mapper which "
        "loader follows)",
        detail=yaml,
    )


def check_handed_state(
    settings: Settings, prior: StateSnapshot, where: str, env: Mapping[str, str] | None = None
) -> None:
    """Refuse a run whose tap got an older state than the one stored now.

    Meltano reads the state before the mapper starts (and takes the lease): if another
    run of the pipeline wrote its final state in between, the tap is resuming from a
    stale bookmark and would load the same rows again. Only checked when the store and
    ID are Meltano's and Meltano handed the tap a state file.
    """
    run = MeltanoRun.from_env(env)
    if run is None or not meltano_owns_state(settings, env):
        return
    if environment(env).get("MELTANO_EXTRACT__STATE"):  # the tap got a state file of the user's
        return
    path = run.handed_state_path()
    if not path:
        return
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return  # no state handed over: a first run or --full-refresh
    try:
        handed = jsonio.loads(data)
    except jsonio.DecodeError:
        return
    if handed == prior.value:
        return
    raise LeaseLost(
        f"the state Meltano handed {run.extractor} is not the state of {settings.state_id} "
        f"in {where} now: another run of this pipeline wrote its state after Meltano read it "
        "(run again to resume from it), or state_id is not this pipeline's Meltano state ID "
        f"({run.state_id_prefix() or ''}<loader>)"
    )


class MeltanoHooks(RunHooks):
    """Meltano's rules, plugged into a run's session."""

    def missing_state_id(self) -> ConfigError | None:
        return missing_state_id()

    def lock_only(self, settings: Settings) -> bool:
        return lock_only(settings)

    def check_prior(self, settings: Settings, prior: StateSnapshot, where: str) -> None:
        check_handed_state(settings, prior, where)
        if settings.lock_only is None and meltano_owns_state(settings):
            log.info(  # only now that the lease is ours: a busy run says only that it is busy
                f"{settings.state_id} is Meltano's own state: holding its lease for the run "
                "and leaving state.json to Meltano (lock_only)"
            )

    def hand_over(self, lease: inherited.AnyLease, settings: Settings) -> bool:
        if not isinstance(lease, Lease):
            return False  # the enclosing run's: it releases it
        explicit = settings.lock_only
        meltanos = meltano_owns_state(settings) if explicit is None else bool(explicit)
        return keeper.hand_over_lease(lease, settings, snapshot=meltanos)


HOOKS = MeltanoHooks()
