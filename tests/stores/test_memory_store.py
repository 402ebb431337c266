"""The in-memory store passes the same contract (it stands in for stores in unit tests)."""

from __future__ import annotations

import uuid

import pytest

from mapper_state.stores import open_store
from mapper_state.stores.base import BlobStore
from mapper_state.testing import LeaseContract, StoreContract


class TestMemoryStore(StoreContract, LeaseContract):
    @pytest.fixture
    def name(self) -> str:
        return f"memory://{uuid.uuid4().hex}"

    @pytest.fixture
    def store(self, name: str) -> BlobStore:
        return open_store(name)

    @pytest.fixture
    def second_client(self, name: str) -> BlobStore:
        return open_store(name)
