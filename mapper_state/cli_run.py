"""``mapper-state run``: the whole tap-to-target job (SPEC 1.1)."""

from __future__ import annotations

import click

COMMANDS: tuple[click.Command, ...] = ()
