"""Singer states in the shapes singer-sdk taps write, for the tests that read or move bookmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sdk_bookmarks(users: str, shops: Sequence[int]) -> dict[str, Any]:
    """Two streams' bookmarks in singer-sdk's shapes: ``users``, a plain bookmark (by
    ``updated_at``, at ``users``); ``orders``, one with partitions (shop 1, 2, ... at the
    values ``shops``)."""
    return {
        "users": {"replication_key": "updated_at", "replication_key_value": users},
        "orders": {
            "partitions": [
                {"context": {"shop": shop}, "replication_key_value": value}
                for shop, value in enumerate(shops, start=1)
            ]
        },
    }
