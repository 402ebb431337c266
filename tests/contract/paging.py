"""Paging a cloud store's listing in the contract: a small page size, and the pages counted.

The built-in cloud stores (:class:`~mapper_state.stores.cloud.CloudStore`) list a page at
a time through ``_list_page``; this is the contract's :class:`~mapper_state.testing.
store_contract.Paging` for them, reaching into the store as only its own tests may.
"""

from __future__ import annotations

from typing import Any

from mapper_state.stores.base import BlobStore
from mapper_state.stores.cloud import CloudStore
from mapper_state.stores.guard import Guarded


class CloudPaging:
    """Pages of a cloud store's listing: a page size set, and each page asked for counted."""

    def __init__(self, store: BlobStore) -> None:
        cloud = store.store if isinstance(store, Guarded) else store
        assert isinstance(cloud, CloudStore), f"{store.display_uri} is not a cloud store"
        self.cloud = cloud
        self.can_skip = cloud.can_skip
        self._pages = 0
        self._counting = False

    def set_page_size(self, keys: int) -> None:
        self.cloud.page_size = keys
        self.count()

    def count(self) -> None:
        """Count the pages asked for from now on (from zero)."""
        self._pages = 0
        if self._counting:
            return
        self._counting = True
        original = self.cloud._list_page

        def counted(*args: Any) -> Any:
            self._pages += 1
            return original(*args)

        self.cloud._list_page = counted  # type: ignore[method-assign, assignment]

    def pages(self) -> int:
        return self._pages
