"""One way to declare an operator command: its arguments, then one call into ``ops``.

::

    @state_group.command("get")
    @click.argument("state_id", type=STATE_ID)
    @format_option
    @store_command(codes=(ExitCode.NOT_FOUND,))
    def state_get(cx: StoreAccess, state_id: str, output_format: str) -> None:
        out(render.dump(ops.get_state(cx.store, state_id), output_format == "text"))

:func:`store_command` adds the store flags (and the lease flags with ``lease=True``),
resolves the settings and opens the store when the command first asks for them, closes
the store when the command ends, and lists the command's exit codes in its ``--help``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Concatenate, ParamSpec

import click

from mapper_state.cli.common import SettingsArgs, command_settings, flagged, settings_command
from mapper_state.errors import ExitCode, LeaseBusy
from mapper_state.ops import commands as ops
from mapper_state.settings import URI_SETTING, Settings
from mapper_state.stores import open_configured_store
from mapper_state.stores.base import BlobStore

P = ParamSpec("P")

#: What any command that opens a store can return.
STORE_CODES = (ExitCode.OK, ExitCode.CONFIG, ExitCode.STORE, ExitCode.INTERRUPTED)
#: What a command that takes the lease can return on top.
LEASE_CODES = (ExitCode.LEASE_BUSY, ExitCode.LEASE_LOST)


class StoreAccess:
    """A command's settings and store, resolved and opened on first use, closed at the end."""

    def __init__(self, ctx: click.Context, given: SettingsArgs) -> None:
        self._ctx = ctx
        self._given = given

    @functools.cached_property
    def settings(self) -> Settings:
        return command_settings(self._ctx, self._given)

    @functools.cached_property
    def store(self) -> BlobStore:
        return open_configured_store(self.settings)

    @property
    def terms(self) -> ops.WriteTerms:
        """How a write takes the lease and keeps history, from the settings."""
        return ops.WriteTerms.from_settings(self.settings)

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()


def store_command(
    *, lease: bool = False, codes: Iterable[int] = ()
) -> Callable[[Callable[Concatenate[StoreAccess, P], None]], Callable[..., None]]:
    """A click callback for ``body(store_access, *its own arguments)``; see the module."""
    specs = flagged("store", "lease") if lease else flagged("store")
    every = (*STORE_CODES, *(LEASE_CODES if lease else ()), *codes)

    def decorate(body: Callable[Concatenate[StoreAccess, P], None]) -> Callable[..., None]:
        def run(
            ctx: click.Context, given: SettingsArgs, /, *args: P.args, **kwargs: P.kwargs
        ) -> None:
            access = StoreAccess(ctx, given)
            try:
                body(access, *args, **kwargs)
            except LeaseBusy as exc:  # which store, and whether its holder still runs here
                origin = access.settings.origin(URI_SETTING)
                state_id = str(kwargs.get("state_id") or "")
                raise ops.busy(exc, access.store, state_id, origin, "") from None
            finally:
                access.close()

        run.__name__ = body.__name__
        run.__doc__ = body.__doc__
        return settings_command(specs, every)(run)

    return decorate
