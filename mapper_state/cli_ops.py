"""Operating the store: ``state``, ``lock`` and ``doctor`` commands (SPEC 1.3)."""

from __future__ import annotations

import click

COMMANDS: tuple[click.Command, ...] = ()
