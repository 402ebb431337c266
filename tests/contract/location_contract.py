"""The contracts of a store on one of the test servers' locations.

:class:`~mapper_state.testing.OnLocation` (shipped) runs the store and lease contracts
with two clients opened on ``location`` (a :class:`~tests.servers.StoreLocation`, a
PostgreSQL location); :class:`OnEmulator` also hands on what the emulator is measured
to ignore and how its cloud store pages a listing; :class:`PrefixContract` checks a URI's ``bucket/prefix`` is joined exactly once.

A test class mixes them in and provides the fixture ``location`` (a fresh location) and,
for :class:`PrefixContract`, ``list_bucket`` (the names of every object in a location's
bucket, listed with the service's own SDK, not the store).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from mapper_state.stores import store_type
from mapper_state.stores.base import BlobStore
from mapper_state.testing import OnLocation
from tests.contract.paging import CloudPaging
from tests.servers import StoreLocation

__all__ = ["OnEmulator", "OnLocation", "PrefixContract"]


class OnEmulator(OnLocation):
    @pytest.fixture
    def ignores_delete_preconditions(self, location: StoreLocation) -> bool:
        return bool(location.emulator.ignores_delete_preconditions)

    @pytest.fixture
    def paging(self, store: BlobStore) -> CloudPaging:
        return CloudPaging(store)


class PrefixContract:
    #: The names of every object in the location's bucket, as the service's own SDK lists them.
    list_bucket: Callable[[StoreLocation], list[str]]

    def test_prefix_is_joined_exactly_once(self, location: StoreLocation) -> None:
        scheme, b = location.emulator.scheme, location.bucket
        alias = store_type(scheme).schemes[-1]  # the scheme's other spelling, where it has one
        location.open(f"{scheme}://{b}/p").create("id/state.json", b"{}")
        for uri in (f"{scheme}://{b}/p/", f"{scheme}://{b}//p/", f"{alias}://{b}/p//"):
            store = location.open(uri)
            assert store.display_uri == f"{scheme}://{b}/p"
            blob = store.read("id/state.json")
            assert blob is not None
            assert blob.data == b"{}"
            assert list(store.list()) == ["id/state.json"]
        at_root = location.open(f"{scheme}://{b}")
        at_root.create("top", b"1")
        assert at_root.display_uri == f"{scheme}://{b}"
        assert self.list_bucket(location) == ["p/id/state.json", "top"]
        assert sorted(at_root.list()) == ["p/id/state.json", "top"]
