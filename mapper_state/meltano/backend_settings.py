"""The add-on's settings as Meltano's ``meltano.settings`` entry points load them.

Each entry point names an attribute of this module (``s3__region``); the attribute is a
Meltano ``SettingDefinition`` made on demand from the store declarations
(:func:`mapper_state.meltano.backend_schemes.addon_settings`), so that ``meltano config list
meltano`` shows every setting of every scheme, secrets marked sensitive. Only Meltano
imports this module.
"""

from __future__ import annotations

import functools
from typing import Any

from meltano.core.setting_definition import SettingDefinition, SettingKind

from mapper_state.meltano import run_hook
from mapper_state.meltano.backend_schemes import addon_settings
from mapper_state.settings import SettingSpec

_KINDS = {"string": "string", "number": "decimal", "integer": "integer", "boolean": "boolean"}
#: Meltano 3.7 knows no ``decimal`` kind (4.0 added it); a number is a string there, which
#: mapper-state's own coercion reads as it reads a ``MAPPER_STATE_*`` variable.
_KNOWN_KINDS = frozenset(kind.value for kind in SettingKind)


def _kind(spec: SettingSpec) -> str:
    kind = "password" if spec.secret else _KINDS[spec.kind]
    return kind if kind in _KNOWN_KINDS else "string"


def definition(spec: SettingSpec) -> Any:
    """Meltano's declaration of one setting."""
    return SettingDefinition(
        name=spec.name,
        kind=_kind(spec),
        label=spec.name.rsplit(".", 1)[1].replace("_", " ").capitalize(),
        description=spec.description.replace("`", ""),
        sensitive=spec.secret or None,
    )


@functools.cache
def _by_attribute() -> dict[str, SettingSpec]:
    return dict(addon_settings())


def __getattr__(name: str) -> Any:
    spec = _by_attribute().get(name)
    if spec is None:
        raise AttributeError(name)
    return definition(spec)


# Meltano loads these entry points at start-up, once its root command knows which subcommand
# runs: the moment to give a `meltano run` / `el` / `elt` its whole-run lease.
run_hook.on_addon_settings_loaded()
