"""The local-file store: the contract, plus what only local files promise."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mapper_state.stores.base import BlobStore, StoreError
from mapper_state.stores.file import FileStore
from mapper_state.testing import LeaseContract, StoreContract


class TestFileStore(StoreContract, LeaseContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> BlobStore:
        return FileStore(tmp_path / "store")

    @pytest.fixture
    def second_client(self, tmp_path: Path) -> BlobStore:
        return FileStore(tmp_path / "store")


def test_files_are_private_and_no_temp_files_remain(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    v = store.create("id/state.json", b"{}")
    store.replace("id/state.json", b'{"a":1}', if_version=v)
    path = tmp_path / "id" / "state.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in (tmp_path / "id").iterdir() if p.name.endswith(".tmp")] == []


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    for key in ("../x", "a/../../x", "/etc/passwd", "a//b", ""):
        with pytest.raises(StoreError, match="invalid key"):
            store.create(key, b"x")
