"""The hook that gives a ``meltano run`` / ``el`` / ``elt`` its whole-run lease, or says why not.

Meltano offers no hook before a run starts its plugins. The add-on finds one: Meltano
loads the add-on's ``meltano.settings`` entry points (:mod:`mapper_state.meltano.backend_settings`)
while its root command finds the project, the subcommand chosen (``ctx.invoked_subcommand``)
but not yet parsed. :func:`on_addon_settings_loaded`, called there, wraps that subcommand's
click callback for ``run``, ``el`` and ``elt``: the wrapper runs once the options are
parsed and the environment activated, before Meltano installs, discovers or starts any
plugin, and takes the leases (:func:`mapper_state.meltano.run_lease.hold_for_run`).

Every Meltano part this relies on is listed and checked in :mod:`mapper_state.meltano.internals`.
**Fail closed**: when one is missing, or the moment never comes (a Meltano that loads the
settings elsewhere), nothing is wrapped and the reason is kept; the add-on's state backend,
which every run with it creates before its first state read, then says in one warning that
the run is not exclusive, which internal was not found on which Meltano, and what to do
(``mapper-state exec``) — or refuses the run, exit 13, when
``state_backend.require_run_lease`` is set (:func:`check_guarded`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from mapper_state import log
from mapper_state.errors import Unguarded
from mapper_state.meltano import internals
from mapper_state.meltano.refusal import Refused

#: The Meltano commands that run a pipeline.
RUN_COMMANDS = frozenset(internals.RUN_OPTIONS)
_ARMED = "_mapper_state_run_lease"


@dataclass
class HookState:
    """What this Meltano process's hook did: armed, ran, or why not."""

    armed: bool = False  #: the subcommand's callback is wrapped
    ran: bool = False  #: the wrapper ran: the run's leases were decided before it started
    reason: str = ""  #: why the hook could not arm, when it could not
    said: bool = False  #: the warning was given (once per process)


STATE = HookState()


def on_addon_settings_loaded() -> None:
    """Arm the whole-run lease if the Meltano subcommand about to run is a pipeline's.

    Called while Meltano loads the add-on's settings; does nothing for any other
    subcommand. Keeps the reason when it cannot arm (see the module's docstring).
    """
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        STATE.reason = (
            "Meltano loaded the add-on's settings outside its command line's start-up "
            "(no click context)"
        )
        return
    root = ctx.find_root()
    name = root.invoked_subcommand
    if name is None:
        STATE.reason = (
            "Meltano loaded the add-on's settings before or after choosing its subcommand "
            "(ctx.invoked_subcommand is not set)"
        )
        return
    if name not in RUN_COMMANDS:
        return
    lacking = internals.missing()
    if lacking:
        STATE.reason = "not found: " + "; ".join(answer.describe() for answer in lacking)
        return
    command = (
        root.command.get_command(root, name) if isinstance(root.command, click.Group) else None
    )
    if command is None or command.callback is None:
        STATE.reason = f"the click command `meltano {name}` was not found under the root command"
        return
    if not getattr(command.callback, _ARMED, False):
        command.callback = _guarded(command.callback)
    STATE.armed = True


def _guarded(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        from mapper_state.core.recorder import exit_code_of
        from mapper_state.meltano.run_lease import exit_if_lost, hold_for_run

        STATE.ran = True
        ctx = click.get_current_context()
        if "run_id" in kwargs and kwargs["run_id"] is None:  # the run's, known before its blocks
            kwargs["run_id"] = uuid.uuid4()  # what Meltano's own new_run_id gives (4.0 on)
        if kwargs.get("database_uri"):  # as the command's `--database-uri` is about to say
            settings = internals.lookup(
                "meltano.core.project_settings_service:ProjectSettingsService"
            )
            settings.config_override["database_uri"] = kwargs["database_uri"]
        run = hold_for_run(ctx.command.name or "", kwargs, ctx.obj or {})
        if run is None:
            return callback(*args, **kwargs)
        try:  # the run's records end with how Meltano's command ended
            result = callback(*args, **kwargs)
        except BaseException as exc:
            run.ended(exit_code_of(exc))
            exit_if_lost(run)  # a run whose lease was lost exits 4, whatever Meltano made of it
            raise
        run.ended(0)
        exit_if_lost(run)
        return result

    setattr(guarded, _ARMED, True)
    return guarded


def check_guarded(command: list[str], require: bool) -> None:
    """Called by the add-on's state backend as a Meltano command creates it: a ``run``,
    ``el`` or ``elt`` the hook did not guard gets one warning, or, with ``require``
    (``state_backend.require_run_lease``), is refused with exit 13."""
    if command[:1] == [] or command[0] not in RUN_COMMANDS or STATE.ran:
        return
    reason = STATE.reason or (
        "Meltano did not load the add-on's settings at start-up"
        if not STATE.armed
        else f"the wrapped callback of `meltano {command[0]}` was not called"
    )
    message = (
        f"no whole-run lease for this meltano {command[0]} on Meltano "
        f"{internals.meltano_version()}: {reason}; another run of this pipeline can run at "
        "the same time"
    )
    hint = (
        "run the pipeline under `mapper-state exec`, whose lease covers the whole run, or a "
        "Meltano the add-on supports (docs/meltano.md)"
    )
    if require:
        raise Refused(Unguarded(message), hint)
    if not STATE.said:
        STATE.said = True
        log.warning(f"{message} ({hint}; set state_backend.require_run_lease to refuse such a run)")
