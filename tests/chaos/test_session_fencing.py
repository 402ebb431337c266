"""A broken holder's next state write is refused by the lease confirmation before it.

A holder with a long TTL (60 s: no heartbeat renews for 20 s) and a checkpoint on
every STATE line; ``lock break`` frees its lease behind its back; its next STATE line
must end the run with exit 4 and store nothing. Only the confirmation the session
makes before each state write can notice: nobody took the lease over, so the state
object never moved.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from mapper_state.errors import ExitCode
from tests.chaos import cli
from tests.chaos.conftest import STORES
from tests.chaos.test_expiry_fencing import a_location


@pytest.mark.parametrize("kind", STORES)
def test_a_broken_holder_stores_nothing_and_exits_4(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    location = a_location(request, kind, tmp_path)
    direct = location.open()
    state_id = f"chaos-broken-{uuid.uuid4().hex[:8]}"
    holder = cli.spawn(
        location, "--state-id", state_id, "--lock-timeout-seconds", "60",
        "--checkpoint-interval-seconds", "0",
    )  # fmt: skip
    try:
        cli.wait_for_holder(direct, state_id, holder.pid)
        broke = cli.run(location, "lock", "break", state_id, "--yes", timeout=60)
        assert broke.returncode == 0, broke.stderr.decode(errors="replace")
        line = json.dumps({"type": "STATE", "value": {"after": "break"}}).encode() + b"\n"
        _, err = holder.communicate(line, timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == ExitCode.LEASE_LOST, err.decode(errors="replace")
    assert cli.stored(direct, state_id) is None, "the broken holder stored its state"
