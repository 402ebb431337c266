"""What every cloud store must do, checked the same way for S3, Azure and GCS: on a bad
wire, in a bucket that does not exist, listing page by page.

Each test module says how to open its store where nothing listens, and its contract class
runs the bad-wire tests of :class:`BadWireContract` (through a :class:`FlakyProxy`'s port);
the checks here are what the user relies on whatever the cloud.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from mapper_state.stores.base import BlobStore, StoreError
from tests.servers import FlakyProxy, StoreLocation

#: Opens the store under test through ``127.0.0.1:port``.
OpenThrough = Callable[[int], BlobStore]

LEASE_KEY = "id/mapper-state.lease.json"

#: What a store can be asked, by name.
ASKS: dict[str, Callable[[BlobStore], object]] = {
    "read": lambda store: store.read("id/state.json"),
    "create": lambda store: store.create("id/state.json", b"{}"),
    "delete": lambda store: store.delete("id/state.json"),
    "list": lambda store: list(store.list()),
}


def check_a_missing_bucket_is_a_clear_error(
    store: BlobStore, match: str, asks: tuple[str, ...] = ("read", "create", "delete", "list")
) -> None:
    """Each of ``asks`` in a bucket that does not exist: a plain :class:`StoreError` saying so."""
    for ask in asks:
        with pytest.raises(StoreError, match=match) as caught:
            ASKS[ask](store)
        assert type(caught.value) is StoreError


def check_list_follows_pagination(store: BlobStore, neighbour: BlobStore) -> None:
    """``store`` (4 names a page) lists its 11 keys whole, and none of ``neighbour``'s, whose
    prefix starts with the same string (``<prefix>ful``) but is another folder."""
    keys = [f"id-{i:02d}/state.json" for i in range(11)]
    for key in keys:
        store.create(key, b"{}")
    neighbour.create("not-mine", b"{}")
    assert sorted(store.list()) == keys
    assert sorted(store.list("id-1")) == keys[10:]


def check_resets_are_retried(
    store: BlobStore, upstream_port: int, open_through: OpenThrough, resets: int
) -> None:
    """A read through a proxy that resets its first ``resets`` connections still answers."""
    store.create("id/state.json", b"kept")
    with FlakyProxy(upstream_port, resets=resets) as proxy:
        blob = open_through(proxy.port).read("id/state.json")
    assert blob is not None
    assert blob.data == b"kept"
    assert proxy.accepted > resets


def check_a_lost_answer_is_not_a_conflict(upstream_port: int, open_through: OpenThrough) -> None:
    """A create applied but answered by nothing is retried; the retry's refusal is our own."""
    with FlakyProxy(upstream_port, lost_responses=1) as proxy:
        store = open_through(proxy.port)
        version = store.create(LEASE_KEY, b"mine")  # the retry meets the first create
        blob = store.read(LEASE_KEY)
    assert blob is not None
    assert blob.data == b"mine"
    assert blob.version == version
    assert proxy.accepted >= 2


def emulator_port(location: StoreLocation) -> int:
    """The port the location's emulator listens on, which a proxy stands in front of."""
    port = urlsplit(location.emulator.endpoint).port
    assert port is not None, location.emulator.endpoint
    return port


def through(location: StoreLocation) -> OpenThrough:
    """Opens the location's store through ``127.0.0.1:port`` rather than its emulator's own
    port, swapped in every setting and variable that names the emulator."""
    upstream = f"127.0.0.1:{emulator_port(location)}"

    def open_through(port: int) -> BlobStore:
        return location.reached_at(upstream, f"127.0.0.1:{port}").open()

    return open_through


class BadWireContract:
    """The two checks above as tests of a cloud store's contract class (which has the
    ``location`` fixture): the same on every cloud."""

    #: How many connections in a row the proxy resets.
    resets = 3

    def test_connection_resets_are_retried(self, location: StoreLocation) -> None:
        store = location.open()
        check_resets_are_retried(store, emulator_port(location), through(location), self.resets)

    def test_a_write_whose_response_was_lost_is_not_reported_as_a_conflict(
        self, location: StoreLocation
    ) -> None:
        """The retry of the create is refused (S3 and GCS answer 412, Azure 409)."""
        check_a_lost_answer_is_not_a_conflict(emulator_port(location), through(location))


def unreachable_error(store: BlobStore) -> str:
    """The one-line message of a read from a store whose endpoint does not answer; it comes
    within 10 s and says the retries ran out."""
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        store.read("id/state.json")
    assert time.monotonic() - started < 10
    assert "attempts" in caught.value.message
    return caught.value.message


def check_other_stores_import_no_sdk(*modules: str) -> None:
    """Opening a file store in a fresh interpreter imports none of ``modules`` (nor below)."""
    code = (
        "import sys, tempfile\n"
        "from mapper_state.stores import open_store\n"
        "open_store('file://' + tempfile.mkdtemp()).list()\n"
        f"assert not [m for m in sys.modules if m.startswith({modules!r})], 'SDK imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
