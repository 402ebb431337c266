"""Shared pytest configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import StoreCli

pytest_plugins = ["tests.servers", "tests.rgw", "tests.pg", "tests.dist"]

#: ``@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)``: the local store and S3.
ON_BOTH = ["local", pytest.param("s3", marks=pytest.mark.cloud)]


@pytest.fixture
def store_cli(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCli:
    """The real CLI on a local store by default; parametrize indirectly with "s3" for moto."""
    kind = getattr(request, "param", "local")
    if kind == "local":
        return StoreCli.local(tmp_path / "store")
    return StoreCli.cloud(request.getfixturevalue(f"{kind}_location"), tmp_path)
