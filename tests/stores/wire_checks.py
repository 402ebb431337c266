"""What every cloud store must do on a bad wire, checked the same way for S3, Azure and GCS.

Each test module says how to open its store through a port (a :class:`FlakyProxy`'s, or
one where nothing listens); the checks here are what the user relies on whatever the cloud.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from mapper_state.stores.base import BlobStore, StoreError
from tests.servers import FlakyProxy

#: Opens the store under test through ``127.0.0.1:port``.
OpenThrough = Callable[[int], BlobStore]

LEASE_KEY = "id/mapper-state.lease.json"


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
