"""Waiting for a lease to be given up, as ``mapper-state lock status`` reports it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from tests.support.processes import wait_until


def wait_until_free(
    lock_status: Callable[[], subprocess.CompletedProcess[Any]], timeout: float = 10
) -> None:
    """Run ``lock_status`` (a ``lock status ID --format json``) until it says the lease is free.

    A run's lease goes within moments of the run returning (its keeper releases it).
    """
    said: list[Any] = []

    def free() -> bool:
        result = lock_status()
        said[:] = [result.stdout]
        return bool(json.loads(result.stdout)["free"])

    try:
        wait_until(free, "the lease was released", timeout)
    except AssertionError:
        raise AssertionError(f"the lease was never released: {said[-1]!r}") from None
