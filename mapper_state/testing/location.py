"""Both contracts on one fixture: a location that opens as many clients as asked.

A server fixture rarely hands out a store directly: it hands out a place (a bucket, a
schema, a directory) that each client opens on its own. :class:`OnLocation` turns a
``location`` fixture into the ``store`` and ``second_client`` fixtures of the contracts.
"""

from __future__ import annotations

from typing import Protocol

import pytest

from mapper_state.stores.base import BlobStore
from mapper_state.testing.lease_contract import LeaseContract
from mapper_state.testing.store_contract import StoreContract


class StoreLocation(Protocol):
    """One fresh, empty location of a store; each ``open()`` is a new, independent client."""

    def open(self) -> BlobStore: ...


class OnLocation(StoreContract, LeaseContract):
    """The store and lease contracts, run with two clients opened on ``location``."""

    @pytest.fixture
    def store(self, location: StoreLocation) -> BlobStore:
        return location.open()

    @pytest.fixture
    def second_client(self, location: StoreLocation) -> BlobStore:
        return location.open()
