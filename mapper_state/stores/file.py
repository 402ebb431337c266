"""The embedded default store: a local directory, written atomically with mode 0600.

Conditional writes are made atomic across processes with an ``flock`` on a
sidecar file per key; readers need no lock because every write is a rename of a
fully written, fsynced temporary file. The version token combines the inode,
the modification time and a hash of the content, so it changes on every write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mapper_state.errors import ConfigError
from mapper_state.fdio import write_all
from mapper_state.stores.base import (
    Blob,
    BlobStore,
    Entry,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
    StoreTraits,
    StoreType,
    check_key,
)

_LOCK_SUFFIX = ".flock"


def _version(st: os.stat_result, data: bytes) -> str:
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{digest}"


class FileStore:
    """A directory tree: key ``a/b/state.json`` is the file ``<root>/a/b/state.json``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.traits = StoreTraits(enforces_delete_conditions=True)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""

    @property
    def display_uri(self) -> str:
        """``file:///abs/path``: the directory read, whatever the cwd of whoever reads the message."""
        return f"file://{os.path.abspath(self.root)}"

    # -- paths -----------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        self._mkdirs(path.parent)
        lock_path = path.with_name("." + path.name + _LOCK_SUFFIX)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _mkdirs(self, directory: Path) -> None:
        try:
            missing = []
            for parent in (directory, *directory.parents):
                if parent.exists():
                    break
                missing.append(parent)
            for parent in reversed(missing):  # each one 0700, not only the last (umask aside)
                with contextlib.suppress(FileExistsError):
                    parent.mkdir(mode=0o700)
                os.chmod(parent, 0o700)
        except PermissionError as exc:
            raise StoreAccessDenied(f"cannot create {directory}: permission denied") from exc
        except OSError as exc:
            raise StoreError(f"cannot create {directory}: {exc.strerror}") from exc

    def _read_path(self, path: Path) -> Blob | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except PermissionError as exc:
            raise StoreAccessDenied(f"cannot read {path}: permission denied") from exc
        except IsADirectoryError:
            return None
        try:
            st = os.fstat(fd)
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)
        return Blob(data, _version(st, data))

    def _write_new_file(self, path: Path, data: bytes) -> tuple[str, str]:
        """Write ``data`` to a fsynced temp file beside ``path``; return (temp path, version)."""
        self._mkdirs(path.parent)
        try:
            fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
        except PermissionError as exc:
            raise StoreAccessDenied(f"cannot write in {path.parent}: permission denied") from exc
        try:
            os.fchmod(fd, 0o600)
            write_all(fd, data)
            os.fsync(fd)
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            os.unlink(tmp)
            raise StoreError(f"cannot write {path}: {exc.strerror}") from exc
        os.close(fd)
        return tmp, _version(st, data)

    def _fsync_dir(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- the interface -----------------------------------------------------------
    def read(self, key: str) -> Blob | None:
        return self._read_path(self._path(key))

    def create(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp, version = self._write_new_file(path, data)
        try:
            os.link(tmp, path)  # atomic create-if-absent
        except FileExistsError as exc:
            raise PreconditionFailed(f"{key} already exists") from exc
        except OSError as exc:
            if exc.errno == errno.EPERM:  # a filesystem without hard links
                return self._create_exclusive(path, key, data)
            raise StoreError(f"cannot create {path}: {exc.strerror}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._fsync_dir(path.parent)
        return version

    def _create_exclusive(self, path: Path, key: str, data: bytes) -> str:
        with self._locked(path):
            if path.exists():
                raise PreconditionFailed(f"{key} already exists")
            tmp, version = self._write_new_file(path, data)
            os.replace(tmp, path)
            self._fsync_dir(path.parent)
            return version

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        path = self._path(key)
        with self._locked(path):
            current = self._read_path(path)
            if current is None or current.version != if_version:
                raise PreconditionFailed(f"{key} changed since version {if_version}")
            tmp, version = self._write_new_file(path, data)
            os.replace(tmp, path)
            self._fsync_dir(path.parent)
            return version

    def delete(self, key: str, if_version: str | None = None) -> None:
        path = self._path(key)
        with self._locked(path):
            if if_version is not None:
                current = self._read_path(path)
                if current is None or current.version != if_version:
                    raise PreconditionFailed(f"{key} changed since version {if_version}")
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.with_name("." + path.name + _LOCK_SUFFIX))
        self._prune_empty_dirs(path.parent)

    def _prune_empty_dirs(self, directory: Path) -> None:
        while directory != self.root and self.root in directory.parents:
            try:
                entries = list(directory.iterdir())
                if any(not e.name.endswith(_LOCK_SUFFIX) for e in entries):
                    return
                for e in entries:
                    e.unlink(missing_ok=True)
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def list(self, prefix: str = "") -> Iterator[str]:
        for key, _ in self._walk(prefix, None):
            yield key

    def list_entries(self, prefix: str = "", exclude: str | None = None) -> Iterator[Entry]:
        """Keys with their files' modification times; an excluded directory is not walked."""
        for key, path in self._walk(prefix, exclude):
            try:
                yield Entry(key, os.stat(path).st_mtime)
            except FileNotFoundError:
                continue  # deleted while listing

    def _walk(self, prefix: str, exclude: str | None) -> Iterator[tuple[str, str]]:
        """``(key, path)`` of the files under ``prefix``, starting at its deepest directory."""
        if exclude and prefix.startswith(exclude):
            return
        start = self.root.joinpath(*prefix.split("/")[:-1]) if "/" in prefix else self.root
        if not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if exclude:
                dirnames[:] = [d for d in dirnames if not (base + d + "/").startswith(exclude)]
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                key = base + name
                if key.startswith(prefix) and not (exclude and key.startswith(exclude)):
                    yield key, os.path.join(dirpath, name)


def from_uri(location: str, options: Mapping[str, Any]) -> FileStore:
    """``file:///abs/path`` gives ``/abs/path``; ``file://rel/path`` a path relative to the cwd.

    A user or password (``file://user:pw@/path``) is refused rather than read as a
    directory named after the credentials.
    """
    if "@" in location.split("/", 1)[0]:
        raise ConfigError(
            "state_backend.uri: a file:// URI takes no user or password; "
            "write file:///abs/path or file://relative/path"
        )
    return FileStore(os.path.expanduser(location) or ".")


STORE = StoreType(
    section="file",
    schemes=("file",),
    opener=from_uri,
    description="`file:///abs/path` or `file://relative/path`: a local directory (the default).",
)


# What the type checker proves: the class serves the store interface.
_STORE: type[BlobStore] = FileStore
