"""The Singer SDK face: ``--about`` in the formats Meltano and its users expect.

The settings schema is generated from the settings catalog (:func:`mapper_state.config.catalog`), so it
never drifts from what the settings parser accepts. The SDK's own about formatters
render JSON and Markdown; it is imported only here, when ``--about`` is asked for.
"""

from __future__ import annotations

from typing import Any

import click

from mapper_state import __version__
from mapper_state.config import catalog
from mapper_state.settings import SettingSpec

NAME = "mapper-state"
DESCRIPTION = (
    "Keeps a Singer pipeline's incremental state in a remote store (local files, S3, "
    "Azure Blob Storage, GCS, PostgreSQL) behind a whole-run lease, passing every byte "
    "through untouched."
)
ENV_PREFIX = "MAPPER_STATE_"


def _property(spec: SettingSpec) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": [spec.kind, "null"], "description": spec.description}
    if spec.default is not None and not spec.secret:
        prop["default"] = spec.default
    if spec.secret:
        prop["secret"] = True
        prop["writeOnly"] = True
    if spec.minimum is not None:
        prop["minimum"] = spec.minimum
    return prop


def settings_schema() -> dict[str, Any]:
    """A JSON schema of every setting, nested by dotted name as Meltano nests config."""
    root: dict[str, Any] = {"type": "object", "properties": {}}
    for spec in catalog():
        node = root
        *parents, leaf = spec.name.split(".")
        for part in parents:
            node = node["properties"].setdefault(
                part, {"type": ["object", "null"], "properties": {}}
            )
        node["properties"][leaf] = _property(spec)
    return root


def about_text() -> str:
    lines = [f"Name: {NAME}", f"Description: {DESCRIPTION}", f"Version: {__version__}", "Settings:"]
    for spec in catalog():
        default = "" if spec.default is None or spec.secret else f" (default: {spec.default})"
        secret = " [secret]" if spec.secret else ""
        lines.append(f"  - {spec.name}: {spec.kind}{secret}{default}")
        lines.append(f"      {spec.description}")
        lines.append(f"      env: {spec.env_var}")
    return "\n".join(lines)


def print_about(fmt: str) -> None:
    if fmt == "text":
        click.echo(about_text())
        return
    from importlib.metadata import version

    from singer_sdk.about import AboutFormatter, AboutInfo
    from singer_sdk.helpers.capabilities import PluginCapabilities

    info = AboutInfo(
        name=NAME,
        description=DESCRIPTION,
        version=__version__,
        sdk_version=version("singer-sdk"),
        supported_python_versions=["3.11", "3.12", "3.13"],
        capabilities=[PluginCapabilities.ABOUT],
        settings=settings_schema(),
        env_var_prefix=ENV_PREFIX,
    )
    click.echo(AboutFormatter.get_formatter(fmt).format_about(info))
