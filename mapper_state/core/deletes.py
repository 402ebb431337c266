"""Deleting an object under the lease, on stores that refuse a delete with a condition.

Some S3 servers enforce conditional PUTs but answer 501 NotImplemented to a
DeleteObject with ``If-Match``. The lease does not need that condition (release is
a compare-and-swap where delete conditions are not trusted), but the operator
commands delete a state they hold the lease on. There, the version is checked by a
read and the object deleted without the condition: the lease keeps every other
writer of this state ID out, so the window the condition closed is the read's.
"""

from __future__ import annotations

from mapper_state.stores.base import BlobStore, ConditionNotSupported, PreconditionFailed


def delete_held(store: BlobStore, key: str, version: str | None) -> None:
    """Delete ``key`` at ``version`` (:class:`PreconditionFailed` if it moved on), with a
    conditional delete where the store takes one, else a checked plain delete.
    ``None``: whatever version it has."""
    if version is None:
        store.delete(key)
        return
    if not store.traits.learned.refuses_delete_conditions.known:
        try:
            store.delete(key, if_version=version)
            return
        except ConditionNotSupported:
            pass  # this very call was refused for its condition: check the version by a read
    current = store.read(key)
    if current is None or current.version != version:
        raise PreconditionFailed(f"{store.display_uri}/{key} changed or is gone")
    store.delete(key)
