"""A broken holder's next state write is refused by the lease confirmation before it.

A holder with a long TTL (60 s: no heartbeat renews for 20 s) and a checkpoint on
every STATE line; ``lock break`` frees its lease behind its back; its next STATE line
must end the run with exit 4 and store nothing. Only the confirmation the session
makes before each state write can notice: nobody took the lease over, so the state
object never moved.
"""

from __future__ import annotations

import uuid

from mapper_state.errors import ExitCode
from tests.chaos import cli
from tests.helpers import state_line
from tests.servers import StoreLocation


def test_a_broken_holder_stores_nothing_and_exits_4(each_store: StoreLocation) -> None:
    location = each_store
    direct = location.open()
    state_id = f"chaos-broken-{uuid.uuid4().hex[:8]}"
    with cli.holding_filter(location, direct, state_id, "60") as holder:
        broke = cli.run(location, "lock", "break", state_id, "--yes", timeout=60)
        assert broke.returncode == 0, broke.stderr.decode(errors="replace")
        _, err = holder.communicate(state_line({"after": "break"}), timeout=60)
    assert holder.returncode == ExitCode.LEASE_LOST, err.decode(errors="replace")
    assert cli.stored(direct, state_id) is None, "the broken holder stored its state"
