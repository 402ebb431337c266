"""The contract of a store whose URI names a bucket (or container) and a prefix in it.

A test class subclasses :class:`PrefixContract` and provides two fixtures: ``location``
(a fresh :class:`~tests.servers.StoreLocation`) and ``bucket_names`` (the names of every
object in that location's bucket, listed with the service's own SDK, not the store).
"""

from __future__ import annotations

from collections.abc import Callable

from mapper_state.stores import store_type
from tests.servers import StoreLocation


class PrefixContract:
    def test_prefix_is_joined_exactly_once(
        self, location: StoreLocation, bucket_names: Callable[[], list[str]]
    ) -> None:
        scheme, b = location.emulator.scheme, location.bucket
        alias = store_type(scheme).schemes[-1]  # the scheme's other spelling, where it has one
        location.open(f"{scheme}://{b}/p").create("id/state.json", b"{}")
        for uri in (f"{scheme}://{b}/p/", f"{scheme}://{b}//p/", f"{alias}://{b}/p//"):
            store = location.open(uri)
            assert store.display_uri == f"{scheme}://{b}/p"
            blob = store.read("id/state.json")
            assert blob is not None and blob.data == b"{}"
            assert list(store.list()) == ["id/state.json"]
        at_root = location.open(f"{scheme}://{b}")
        at_root.create("top", b"1")
        assert at_root.display_uri == f"{scheme}://{b}"
        assert bucket_names() == ["p/id/state.json", "top"]
        assert sorted(at_root.list()) == ["p/id/state.json", "top"]
