"""The contract every store must pass, shipped so that a store written outside the project
is checked by the same tests as the built-in ones.

A store's test module subclasses the contracts and provides two pytest fixtures:
``store`` (a fresh store on an empty location of a real server) and ``second_client``
(another, independent client of the same location, as another process would open)::

    import pytest
    from mapper_state.testing import LeaseContract, StoreContract

    class TestMyStore(StoreContract, LeaseContract):
        @pytest.fixture
        def store(self, tmp_path): return MyStore(tmp_path)

        @pytest.fixture
        def second_client(self, tmp_path): return MyStore(tmp_path)

Or subclass :class:`OnLocation` and provide one fixture ``location``: anything whose
``open()`` returns a new client of one fresh location.

This is the only part of the package that imports pytest (``pip install
'mapper-state[testing]'``); nothing else in the package imports it.
"""

from __future__ import annotations

from mapper_state.testing.lease_contract import LeaseContract
from mapper_state.testing.location import OnLocation, StoreLocation
from mapper_state.testing.racing import race
from mapper_state.testing.store_contract import StoreContract, went_through

__all__ = [
    "LeaseContract",
    "OnLocation",
    "StoreContract",
    "StoreLocation",
    "race",
    "went_through",
]
