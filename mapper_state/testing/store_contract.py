"""The contract every store must pass, whatever it talks to.

A store's test module subclasses :class:`StoreContract` and provides two fixtures:
``store`` (a fresh store on an empty prefix of a real server) and ``second_client``
(another, independent client on the same location, as another process would have).
A server measured to ignore conditional deletes says so by overriding the fixture
``ignores_delete_preconditions``; a store whose listing comes in pages says how to page
it by overriding ``paging`` (a :class:`Paging`).

The contract checks the store as mapper-state uses it: the deadline a caller carries is
kept above the stores (:mod:`mapper_state.stores.guard`), and checked here through it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from mapper_state.core import state
from mapper_state.core.lease import releases_by_delete
from mapper_state.stores import deadline
from mapper_state.stores.base import BlobStore, PreconditionFailed, listing
from mapper_state.stores.deadline import DeadlinePassed
from mapper_state.stores.guard import guarded
from mapper_state.testing.racing import race


class Paging(Protocol):
    """How the contract pages a store's listing, for a store whose listing comes in pages:
    its test module overrides the ``paging`` fixture with one of these."""

    #: The service can start a listing after a given key, so an excluded range is skipped.
    can_skip: bool

    def set_page_size(self, keys: int) -> None:
        """From now on, ask the service for at most ``keys`` keys a page."""
        ...

    def pages(self) -> int:
        """The listing pages asked for since :meth:`set_page_size`."""
        ...


def data_of(store: BlobStore, key: str) -> bytes | None:
    """The bytes the store holds at ``key`` (``None``: no such object)."""
    blob = store.read(key)
    return None if blob is None else blob.data


def write_state(
    store: BlobStore, state_id: str, value: Any, if_version: str | None, **writer: Any
) -> str:
    """Write a state document as a run does (``writer``: its ``serial`` and ``run_id``),
    straight to the store's conditional calls.

    The contract checks the store, not the commit path: ``if_version`` ``None`` creates,
    anything else replaces that version; a refusal is the store's ``PreconditionFailed``.
    """
    data = state.encode_document(value, **writer)
    key = state.state_key(state_id)
    if if_version is None:
        return store.create(key, data)
    return store.replace(key, data, if_version=if_version)


def went_through(write: Callable[[], object]) -> bool:
    """Whether a conditional write was made (``False``: the store refused it)."""
    try:
        write()
    except PreconditionFailed:
        return False
    return True


class StoreContract:
    @pytest.fixture
    def ignores_delete_preconditions(self) -> bool:
        """Whether the server behind ``store`` is known to ignore a conditional delete."""
        return False

    @pytest.fixture
    def paging(self, store: BlobStore) -> Paging | None:
        """How to page ``store``'s listing; ``None``: it does not come in pages."""
        return None

    def test_read_absent_is_none(self, store: BlobStore) -> None:
        assert store.read("nope/state.json") is None

    def test_create_then_read(self, store: BlobStore) -> None:
        version = store.create("a/state.json", b'{"x": 1}')
        blob = store.read("a/state.json")
        assert blob is not None
        assert blob.data == b'{"x": 1}'
        assert blob.version == version

    def test_create_refuses_existing(self, store: BlobStore) -> None:
        store.create("a/lock", b"first")
        with pytest.raises(PreconditionFailed):
            store.create("a/lock", b"second")
        assert data_of(store, "a/lock") == b"first"

    def test_replace_with_current_version(self, store: BlobStore) -> None:
        v1 = store.create("k", b"one")
        v2 = store.replace("k", b"two", if_version=v1)
        assert v2 != v1
        blob = store.read("k")
        assert blob is not None
        assert blob.data == b"two"
        assert blob.version == v2

    def test_replace_with_stale_version_is_refused(self, store: BlobStore) -> None:
        v1 = store.create("k", b"one")
        store.replace("k", b"two", if_version=v1)
        with pytest.raises(PreconditionFailed):
            store.replace("k", b"three", if_version=v1)
        assert data_of(store, "k") == b"two"

    def test_rewriting_the_same_state_gives_a_new_version(self, store: BlobStore) -> None:
        # S3's versions are content hashes: only unique bytes per write (a serial and the
        # writer's run ID in the document) make a compare-and-swap on them sound
        v1 = write_state(store, "same", {"bookmarks": {"a": 1}}, None, serial=1, run_id="one")
        v2 = write_state(store, "same", {"bookmarks": {"a": 1}}, v1, serial=2, run_id="one")
        assert v2 != v1
        with pytest.raises(PreconditionFailed):  # still conditional on the old version
            write_state(store, "same", {"bookmarks": {"a": 0}}, v1, serial=2, run_id="old")
        assert state.load(store, "same").value == {"bookmarks": {"a": 1}}
        assert write_state(store, "same", {"bookmarks": {"a": 2}}, v2, serial=3, run_id="one")

    def test_replace_absent_is_refused(self, store: BlobStore) -> None:
        v1 = store.create("k", b"one")
        store.delete("k")
        with pytest.raises(PreconditionFailed):
            store.replace("k", b"two", if_version=v1)
        assert store.read("k") is None

    def test_a_version_never_repeats_after_a_delete(self, store: BlobStore) -> None:
        # a counter that restarts at 1 when the key is recreated would let a stale version
        # match a newer object (A-B-A): a stalled holder renewing another run's lease
        seen = [store.create("aba", b"first life 1")]
        seen.append(store.replace("aba", b"first life 2", if_version=seen[-1]))
        store.delete("aba")
        version = store.create("aba", b"second life 1")
        for n in range(2, 4):
            assert version not in seen, f"version {version!r} came back after a delete"
            seen.append(version)
            version = store.replace("aba", f"second life {n}".encode(), if_version=version)
        for stale in seen[:2]:
            with pytest.raises(PreconditionFailed):
                store.replace("aba", b"stale writer", if_version=stale)
        assert data_of(store, "aba") == b"second life 3"

    def test_one_store_object_serves_two_threads(self, store: BlobStore) -> None:
        # the lease's heartbeat renews from its own thread while the run reads and writes
        def work(i: int) -> bool:
            key = f"thread-{i}/state.json"
            version = store.create(key, b"0")
            for n in range(1, 6):
                version = store.replace(key, str(n).encode(), if_version=version)
                blob = store.read(key)
                assert blob is not None
                assert blob.version == version
            return True

        assert race([functools.partial(work, i) for i in range(2)]) == [0, 1]
        for i in range(2):
            assert data_of(store, f"thread-{i}/state.json") == b"5"

    def test_delete_unconditional_and_absent(self, store: BlobStore) -> None:
        store.create("k", b"one")
        store.delete("k")
        assert store.read("k") is None
        store.delete("k")  # absent: not an error

    def test_delete_with_version(self, store: BlobStore) -> None:
        v1 = store.create("k", b"one")
        store.delete("k", if_version=v1)
        assert store.read("k") is None

    def test_delete_with_stale_version_is_refused(
        self, store: BlobStore, ignores_delete_preconditions: bool
    ) -> None:
        v1 = store.create("k", b"one")
        store.replace("k", b"two", if_version=v1)
        if ignores_delete_preconditions:
            # a server known to ignore the condition (pinned in its own tests): the store
            # must not claim it holds, so a lease there is released by compare-and-swap
            assert not releases_by_delete(store)
            return
        with pytest.raises(PreconditionFailed):
            store.delete("k", if_version=v1)
        assert store.read("k") is not None

    def test_a_call_whose_deadline_has_passed_sends_nothing(self, store: BlobStore) -> None:
        """The deadline a caller carries into a store's calls holds (a renewal after the
        lease was given up must not reach the store): once it has passed, nothing is sent.
        The registry keeps it for every store it opens (:func:`guarded`); a store whose
        one call sends several requests checks before each of them."""
        store = guarded(store)
        version = store.create("late/lock", b"before")
        with deadline.within(0):
            with pytest.raises(DeadlinePassed):
                store.replace("late/lock", b"after", version)
            with pytest.raises(DeadlinePassed):
                store.create("late/other", b"after")
            with pytest.raises(DeadlinePassed):
                store.delete("late/lock", if_version=version)
            with pytest.raises(DeadlinePassed):
                store.read("late/lock")
            with pytest.raises(DeadlinePassed):
                list(store.list("late/"))
            with pytest.raises(DeadlinePassed):
                list(listing(store, "late/"))
        blob = store.read("late/lock")
        assert blob is not None
        assert (blob.data, blob.version) == (b"before", version)
        assert store.read("late/other") is None
        with deadline.within(30):  # a deadline with time left changes nothing
            assert store.replace("late/lock", b"in time", version) != version

    def test_list_prefix(self, store: BlobStore) -> None:
        for key in ("p/a/state.json", "p/b/state.json", "p/b/lock", "q/state.json"):
            store.create(key, b"{}")
        assert sorted(store.list("p/")) == ["p/a/state.json", "p/b/lock", "p/b/state.json"]
        assert sorted(store.list()) == [
            "p/a/state.json",
            "p/b/lock",
            "p/b/state.json",
            "q/state.json",
        ]

    def test_listing_excludes_a_range_and_reports_modification_times(
        self, store: BlobStore
    ) -> None:
        kept = ["-early/state.json", "a/state.json", "a/x", "z/state.json"]
        hidden = [f".mapper-state/history/a/{i}.json" for i in range(3)]
        before = time.time()
        for key in kept + hidden:
            store.create(key, b"{}")
        entries = list(listing(store, exclude=".mapper-state/"))
        assert sorted(e.key for e in entries) == kept
        for entry in entries:  # the server's clock: allow for skew with this machine's
            assert entry.modified is not None, f"{entry.key} has no modification time"
            assert before - 300 < entry.modified < time.time() + 300
        assert sorted(e.key for e in listing(store, "a/", exclude=".mapper-state/")) == kept[1:3]
        assert list(listing(store, ".mapper-state/history/", exclude=".mapper-state/")) == []
        assert sorted(e.key for e in listing(store, ".mapper-state/")) == hidden
        assert sorted(store.list()) == sorted(kept + hidden)  # plain list: everything

    def test_listing_skips_an_excluded_range_where_the_store_can(
        self, store: BlobStore, paging: Paging | None
    ) -> None:
        """A paged store that can start a listing at a key jumps over the excluded range; one
        that cannot (Azure's listing has no start key) pages through it, and says so with
        ``can_skip = False``; a store that excludes it in its own query (PostgreSQL) needs
        neither. Every one returns the same keys."""
        if paging is not None:
            paging.set_page_size(2)
        keys = ["-a/state.json", "-b/state.json", "b/state.json", "c/state.json"]
        for key in [*keys, *(f".mapper-state/history/b/{i:02d}.json" for i in range(12))]:
            store.create(key, b"{}")
        assert sorted(e.key for e in listing(store, exclude=".mapper-state/")) == keys
        if paging is not None and paging.can_skip:
            assert paging.pages() <= 4, (
                f"{paging.pages()} pages for 4 keys, 2 a page: the excluded range was paged"
            )
        elif paging is not None:  # 16 keys, 2 a page: the cost of a store that cannot skip
            assert paging.pages() >= 8, f"{paging.pages()} pages for 16 keys, 2 a page"

    def test_keys_with_meltano_ids(self, store: BlobStore) -> None:
        key = "dev:tap-a-to-target-b/state.json"
        store.create(key, b"{}")
        assert list(store.list("dev:tap-a-to-target-b/")) == [key]

    def test_binary_and_large_values(self, store: BlobStore) -> None:
        data = bytes(range(256)) * 8192  # 2 MiB
        store.create("big", data)
        assert data_of(store, "big") == data

    def test_second_client_sees_writes_and_conflicts(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        v1 = store.create("shared", b"one")
        blob = second_client.read("shared")
        assert blob is not None
        assert blob.data == b"one"
        assert blob.version == v1
        second_client.replace("shared", b"two", if_version=v1)
        with pytest.raises(PreconditionFailed):
            store.replace("shared", b"mine", if_version=v1)

    def test_racing_creates_have_one_winner(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        for round_ in range(5):
            key = f"race/{round_}"

            def create(client: BlobStore, i: int, key: str = key) -> bool:
                return went_through(lambda: client.create(key, str(i).encode()))

            winners = race(
                [functools.partial(create, (store, second_client)[i % 2], i) for i in range(4)]
            )
            assert len(winners) == 1
            assert data_of(store, key) == str(winners[0]).encode()

    def test_racing_replaces_have_one_winner(
        self, store: BlobStore, second_client: BlobStore
    ) -> None:
        version = store.create("cas", b"0")

        def replace(client: BlobStore, i: int) -> bool:
            return went_through(lambda: client.replace("cas", str(i + 1).encode(), version))

        winners = race(
            [functools.partial(replace, (store, second_client)[i % 2], i) for i in range(4)]
        )
        assert len(winners) == 1
