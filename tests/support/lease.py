"""Waiting for a lease to be given up, as ``mapper-state lock status`` reports it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.processes import MAPPER, wait_until


def wait_until_free(
    state_id: str,
    env: Mapping[str, str],
    *,
    mapper_state: str | Path = MAPPER,
    timeout: float = 10,
) -> None:
    """Run ``mapper-state lock status STATE_ID --format json`` in ``env`` (which names the
    store) until it says the lease is free; ``mapper_state``: the executable to ask.

    A run's lease goes within moments of the run returning (its keeper releases it).
    """
    command = [str(mapper_state), "lock", "status", state_id, "--format", "json"]
    said: list[Any] = []

    def free() -> bool:
        result = subprocess.run(
            command, env=dict(env), capture_output=True, text=True, timeout=60, check=False
        )
        said[:] = [result.stdout + result.stderr]
        return result.returncode == 0 and bool(json.loads(result.stdout)["free"])

    try:
        wait_until(free, "the lease was released", timeout)
    except AssertionError:
        raise AssertionError(f"the lease was never released: {said[-1]!r}") from None
