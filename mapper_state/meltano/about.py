"""``--about`` in the formats Meltano and its users expect (those of the Singer SDK).

The settings schema is generated from the settings catalog (:func:`mapper_state.config.catalog`), so it
never drifts from what the settings parser accepts. JSON and Markdown are rendered here
in the Singer SDK's layout (its ``AboutFormatter``), without the SDK: it is not a
dependency (with SQLAlchemy and the rest it would triple the installed size).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
    if spec.maximum is not None:
        prop["maximum"] = spec.maximum
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


#: The Singer capabilities mapper-state declares.
CAPABILITIES = ("about",)
#: What the classifiers claim and CI tests: Python 3.11 (newer versions are not tested yet).
PYTHON_VERSIONS = ("3.11",)


def about_json() -> str:
    """The SDK's ``--about --format json``: name, description, version, capabilities, settings."""
    data = {
        "name": NAME,
        "description": DESCRIPTION,
        "version": __version__,
        "supported_python_versions": list(PYTHON_VERSIONS),
        "capabilities": list(CAPABILITIES),
        "settings": settings_schema(),
    }
    return json.dumps(data, indent=2)


def _rows(schema: dict[str, Any], parent: str = "") -> Iterator[str]:
    required = schema.get("required", [])
    for name, prop in schema.get("properties", {}).items():
        full = f"{parent}.{name}" if parent else name
        description = prop.get("description", "").replace("\n", "<BR/>")
        yield f"| {full} | {name in required} | {prop.get('default', 'None')} | {description} |"
        yield from _rows(prop, full)


def about_markdown() -> str:
    """The SDK's ``--about --format markdown``: a header, capabilities and a settings table."""
    lines = [
        f"# `{NAME}`",
        "",
        DESCRIPTION,
        "",
        "## Capabilities",
        "",
        *(f"- `{c}`" for c in CAPABILITIES),
        "",
        "## Supported Python Versions",
        "",
        *(f"- {v}" for v in PYTHON_VERSIONS),
        "",
        "## Settings",
        "",
        "| Setting | Required | Default | Description |",
        "|:--------|:--------:|:-------:|:------------|",
        *_rows(settings_schema()),
        "",
        f"A full list of supported settings and capabilities is available by running: "
        f"`{NAME} --about`",
    ]
    return "\n".join(lines) + "\n"


def print_about(fmt: str) -> None:
    render = {"text": about_text, "json": about_json, "markdown": about_markdown}[fmt]
    click.echo(render())
