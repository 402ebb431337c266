"""The Meltano internals the whole-run lease relies on, listed and checked in one place.

Meltano has no public hook that runs before ``meltano run`` / ``el`` / ``elt`` starts its
plugins, so :mod:`mapper_state.meltano.run_hook` uses parts of Meltano that are not an
interface and may move in any release. Each is an :class:`Internal` below; :func:`check`
says, per internal, whether this Meltano has it. The hook arms only when every one is
found, and otherwise says which is missing (fail closed); a test runs :func:`check`
against every supported Meltano (``make test-meltano-versions``), so a new release that
moves one is named at once. Read in Meltano 3.7.9 to 4.4.1, where all are found.

The hook takes these objects from :func:`lookup` only, never by importing Meltano itself.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

#: The Meltano commands that run a pipeline, and the options of each the hook reads.
RUN_OPTIONS: dict[str, tuple[str, ...]] = {
    "run": (
        "blocks",
        "dry_run",
        "no_state_update",
        "full_refresh",
        "state_id_suffix",
        "run_id",
        "install_plugins",
        "database_uri",
    ),
    "el": ("state_id", "dry", "dump", "full_refresh", "run_id", "install_plugins", "database_uri"),
    "elt": ("state_id", "dry", "dump", "full_refresh", "run_id", "install_plugins", "database_uri"),
}
#: The keyword arguments of Meltano's block parser the hook passes.
BLOCK_PARSER_KEYWORDS = ("full_refresh", "no_state_update", "state_id_suffix", "run_id")


@dataclass(frozen=True)
class Internal:
    """One part of Meltano the hook uses: ``module:attribute`` and what it is used for."""

    name: str
    used_for: str
    #: A check beyond the attribute's presence (its signature, say); the problem, or "".
    shape: Callable[[Any], str] | None = None

    @property
    def module(self) -> str:
        return self.name.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.name.partition(":")[2]


@dataclass(frozen=True)
class Found:
    """The answer of :func:`check` for one internal."""

    internal: Internal
    found: bool
    problem: str = ""

    def describe(self) -> str:
        return f"{self.internal.name} ({self.problem})"


def _keywords(*names: str) -> Callable[[Any], str]:
    def shape(obj: Any) -> str:
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return "no signature"
        missing = [n for n in names if n not in params]
        return f"no keyword {', '.join(missing)}" if missing else ""

    return shape


def _options(command: str) -> Callable[[Any], str]:
    def shape(obj: Any) -> str:
        params = {p.name for p in getattr(obj, "params", ())}
        if getattr(obj, "callback", None) is None:
            return "no click callback"
        missing = [n for n in RUN_OPTIONS[command] if n not in params]
        return f"no option {', '.join(missing)}" if missing else ""

    return shape


def _class_attribute(name: str) -> Callable[[Any], str]:
    return lambda obj: "" if hasattr(obj, name) else f"no attribute {name}"


INTERNALS: tuple[Internal, ...] = (
    Internal(
        "meltano.core.config_service:ConfigService",
        "the moment: Meltano loads the add-on's `meltano.settings` entry points through "
        "ConfigService.settings while its root command finds the project, its subcommand "
        "chosen and not yet run (ctx.invoked_subcommand)",
        _class_attribute("settings"),
    ),
    *(
        Internal(
            f"meltano.cli.{module}:{command}",
            f"the click command `meltano {command}`, whose "
            "callback is wrapped, and the options read from it",
            _options(command),
        )
        for module, command in (("run", "run"), ("elt", "el"), ("elt", "elt"))
    ),
    Internal(
        "meltano.cli.params:_install_plugins_and_exit",
        "telling `--only-install` (no run) from a run",
    ),
    Internal(
        "meltano.core.block.block_parser:BlockParser",
        "the state IDs of a `meltano run`'s blocks, parsed as Meltano parses them",
        _keywords(*BLOCK_PARSER_KEYWORDS),
    ),
    Internal(
        "meltano.core.block.extract_load:ExtractLoadBlocks",
        "the extract-load blocks among them (their context.job.job_name)",
    ),
    Internal(
        "meltano.core.plugin_invoker:PluginInvoker",
        "which of the run's processes are its extractors (PluginInvoker.invoke_async, "
        "self.plugin.type): a lease broken by an operator stops those first, so that the "
        "loader finishes what it was sent and Meltano keeps the state it confirms",
        _class_attribute("invoke_async"),
    ),
    Internal(
        "meltano.core.db:project_engine",
        "the system database the block parser reads plugin settings from",
        _keywords("default"),
    ),
    Internal(
        "meltano.core.migration_service:MigrationService",
        "setting that database up first, as the command does",
        _class_attribute("upgrade"),
    ),
    Internal(
        "meltano.core.project_settings_service:ProjectSettingsService",
        "`--database-uri`, applied a moment before the command applies it",
        _class_attribute("config_override"),
    ),
    Internal(
        "meltano.core.state_store:state_store_manager_from_project_settings",
        "the state backend of the project, the same store as the run's state writes",
    ),
)


def _resolve(internal: Internal) -> Any:
    module = importlib.import_module(internal.module)
    obj: Any = module
    for part in internal.attribute.split("."):
        obj = getattr(obj, part)
    return obj


def check(internals: Iterable[Internal] = INTERNALS) -> list[Found]:
    """Per internal, whether this Meltano has it (and in the shape the hook uses)."""
    answers = []
    for internal in internals:
        try:
            obj = _resolve(internal)
        except ImportError as exc:
            answers.append(Found(internal, False, f"cannot import {internal.module}: {exc}"))
            continue
        except AttributeError:
            answers.append(Found(internal, False, "not found"))
            continue
        problem = internal.shape(obj) if internal.shape else ""
        answers.append(Found(internal, not problem, problem))
    return answers


def missing() -> list[Found]:
    """The internals this Meltano lacks; empty when the hook can arm."""
    return [answer for answer in check() if not answer.found]


def lookup(name: str) -> Any:
    """The Meltano object an :class:`Internal` of :data:`INTERNALS` names."""
    internal = next((i for i in INTERNALS if i.name == name), None)
    if internal is None:
        raise KeyError(f"{name} is not listed in mapper_state.meltano.internals.INTERNALS")
    return _resolve(internal)


def meltano_version() -> str:
    """The installed Meltano's version, ``unknown`` when its metadata cannot be read."""
    try:
        return version("meltano")
    except PackageNotFoundError:
        return "unknown"
