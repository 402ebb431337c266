"""The environment Meltano gives a mapping, for tests that run mapper-state as Meltano does."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import clean_env


def mapping_env(project: Path, backend: str, **extra: str) -> dict[str, str]:
    """The variables Meltano 4.4.1 gives a mapping that mapper-state reads (docs/real-tools.md):
    the project, the run's names and Meltano's state backend URI; then ``extra``."""
    return clean_env(
        MELTANO_PROJECT_ROOT=str(project),
        MELTANO_SYS_DIR_ROOT=str(project / ".meltano"),
        MELTANO_ENVIRONMENT="dev",
        MELTANO_EXTRACTOR_NAME="tap-sample",
        MELTANO_MAPPER_NAME="mapper-state",
        MELTANO_MAP__MAPPING_NAME="remote-state",
        MELTANO_STATE_BACKEND_URI=backend,
        **extra,
    )
