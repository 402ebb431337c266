"""Google Cloud Storage through google-cloud-storage.

``gs://bucket/prefix``. The version is the object's generation, which GCS changes
on every write: create uploads with ``if_generation_match=0``, replace with
``if_generation_match=<generation>``, a versioned delete deletes with
``if_generation_match``.

Credentials: ``state_backend.gcs.application_credentials_path`` or
``state_backend.gcs.application_credentials_json``, else Application Default
Credentials. Like the Google SDK, ``STORAGE_EMULATOR_HOST`` (read when the store
is opened) points the store at an emulator with anonymous credentials.

Emulators differ from GCS: fake-gcs-server enforces ``if_generation_match`` on
single-request uploads (8 MiB or less; larger uploads are resumable) but ignores
it on deletes; gcp-storage-emulator ignores every precondition, so locking on it
is unsafe and ``doctor`` says so. The store always sends the preconditions, and
against an emulator (``STORAGE_EMULATOR_HOST``) its traits do not claim that a
conditional delete is enforced, so a lease there is released by compare-and-swap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import storage

from mapper_state.errors import ConfigError
from mapper_state.stores import base
from mapper_state.stores.cloud import CloudStore, Page, split_location
from mapper_state.stores.retry import RetryStats

_SETTING = "state_backend.gcs."
_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]


class _ReplacedWhileReading(Exception):
    """The object changed between reading its generation and its bytes."""


_TRANSIENT = (
    _ReplacedWhileReading,
    api.TooManyRequests,
    api.ServerError,
    api.RequestRangeNotSatisfiable,  # the object changed mid-download
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    auth.TransportError,
    ConnectionError,
)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, auth.RefreshError):
        return bool(getattr(exc, "retryable", False))
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, requests.exceptions.SSLError)


class GcsStore(CloudStore):
    """Objects under ``prefix`` in one bucket; keys are relative to the prefix."""

    scheme = "gs"

    def __init__(
        self, client: storage.Client, bucket: str, prefix: str = "", **kwargs: Any
    ) -> None:
        # an emulator may ignore delete preconditions (fake-gcs-server does): release by CAS
        super().__init__(bucket, prefix, enforces_delete_conditions=not _emulator_host(), **kwargs)
        self.client = client
        self.bucket = client.bucket(bucket)
        self._bucket_seen = False

    def close(self) -> None:
        self.client.close()

    def _blob(self, key: str) -> storage.Blob:
        return self.bucket.blob(self._key(key))

    _is_transient = staticmethod(_is_transient)

    def _store_error(
        self, exc: Exception, op: str, where: str, stats: RetryStats
    ) -> base.StoreError | None:
        if isinstance(
            exc,
            (api.Unauthorized, api.Forbidden, auth.RefreshError, auth.DefaultCredentialsError),
        ):
            return base.StoreAccessDenied(
                f"Google Cloud Storage refused {op} of {where}: {type(exc).__name__} (check "
                f"{_SETTING}application_credentials_path or the account's role on the bucket)"
            )
        if isinstance(exc, api.NotFound):
            if not self._bucket_exists():
                return self._missing_bucket()
            return base.StoreError(f"Google Cloud Storage {op} of {where} failed: not found")
        if isinstance(exc, api.GoogleAPICallError):
            return base.StoreError(
                f"Google Cloud Storage {op} of {where} failed: HTTP {exc.code}{stats.summary()}"
            )
        if isinstance(exc, _TRANSIENT):
            return base.StoreError(
                f"cannot reach Google Cloud Storage at {self.client.api_endpoint} for {op} of "
                f"{where}: {type(exc).__name__}{stats.summary()}"
            )
        return None

    def _bucket_exists(self) -> bool:
        """GCS answers 404 alike for a missing object and a missing bucket: ask once."""
        if not self._bucket_seen:
            self._bucket_seen = self._call(
                "check bucket", "", lambda: self.bucket.exists(timeout=self.timeouts(), retry=None)
            )
        return self._bucket_seen

    def _missing_bucket(self) -> base.StoreError:
        return base.missing_bucket(
            "Google Cloud Storage bucket", self.bucket.name, self.client.api_endpoint
        )

    def _upload(self, op: str, key: str, data: bytes, generation: int) -> str:
        blob = self._blob(key)

        def upload() -> str:
            try:
                blob.upload_from_string(
                    data,
                    content_type="application/octet-stream",
                    if_generation_match=generation,
                    timeout=self.timeouts(),
                    retry=None,
                )
            except api.PreconditionFailed:
                raise self._refused(key, "changed or exists") from None
            return str(blob.generation)

        return self._conditional_write(op, key, data, upload)

    # -- the interface -----------------------------------------------------------
    def read(self, key: str) -> base.Blob | None:
        blob = self._blob(key)

        def download() -> base.Blob | None:
            try:
                data = blob.download_as_bytes(timeout=self.timeouts(), retry=None)
                generation = blob.generation
                if generation is None:
                    # GCS sends x-goog-generation with the bytes; some emulators do not. Ask
                    # for it, then fetch the bytes of exactly that generation.
                    blob.reload(timeout=self.timeouts(), retry=None)
                    generation = blob.generation
                    data = blob.download_as_bytes(
                        if_generation_match=generation, timeout=self.timeouts(), retry=None
                    )
            except api.NotFound:
                if self._bucket_exists():
                    return None
                raise self._missing_bucket() from None
            except api.PreconditionFailed:  # replaced between the two requests: read again
                raise _ReplacedWhileReading from None
            return base.Blob(data, str(generation))

        return self._call("read", key, download)

    def create(self, key: str, data: bytes) -> str:
        return self._upload("create", key, data, 0)

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        try:
            generation = int(if_version)
        except ValueError:
            raise base.PreconditionFailed(
                f"{if_version!r} is not a generation of {self.display_uri}/{key}"
            ) from None
        return self._upload("replace", key, data, generation)

    def delete(self, key: str, if_version: str | None = None) -> None:
        blob = self._blob(key)
        generation = None if if_version is None else int(if_version)

        def delete() -> None:
            try:
                blob.delete(if_generation_match=generation, timeout=self.timeouts(), retry=None)
            except api.PreconditionFailed:
                raise self._refused(key, "changed") from None
            except api.NotFound:
                if not self._bucket_exists():
                    raise self._missing_bucket() from None
                if generation is not None:
                    raise self._refused(key, "no longer exists") from None

        self._call("delete", key, delete)

    def _list_page(self, prefix: str, token: str | None, after: str | None = None) -> Page:
        blobs = self.client.list_blobs(
            self.bucket,
            prefix=prefix,
            page_token=token,
            page_size=self.page_size,
            # the first name past every name under ``after``: its last character, plus one
            start_offset=after[:-1] + chr(ord(after[-1]) + 1) if after else None,
            timeout=self.timeouts(),
            retry=None,
        )
        entries = [
            (b.name, b.updated.timestamp() if b.updated else None) for b in next(blobs.pages, [])
        ]
        return entries, blobs.next_page_token


class _UnsupportedCredentials(Exception):
    """A credentials JSON of a type this store does not load."""


def _credentials(options: Mapping[str, Any]) -> tuple[Credentials | None, str | None]:
    """Explicit credentials from the settings (and their project), or none for ADC."""
    path = options.get("application_credentials_path")
    text = options.get("application_credentials_json")
    if path and text:
        raise ConfigError(
            f"settings {_SETTING}application_credentials_path and "
            f"{_SETTING}application_credentials_json are both set: keep one"
        )
    if not path and not text:
        return None, None
    name = "application_credentials_path" if path else "application_credentials_json"
    try:
        if path:
            with open(os.path.expanduser(str(path)), encoding="utf-8") as f:
                text = f.read()
        info = json.loads(str(text))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        return _from_info(info), info.get("project_id") or info.get("quota_project_id")
    except OSError as exc:
        raise ConfigError(
            f"setting {_SETTING}{name}: cannot read {path} ({exc.strerror})"
        ) from None
    except _UnsupportedCredentials as exc:
        raise ConfigError(
            f"setting {_SETTING}{name} holds credentials of type {exc}: use service_account, "
            "authorized_user or external_account ones, or Application Default Credentials"
        ) from None
    except (ValueError, KeyError, TypeError, auth.GoogleAuthError):
        raise ConfigError(
            f"setting {_SETTING}{name} does not hold usable Google credentials"
        ) from None


def _from_info(info: dict[str, Any]) -> Credentials:
    """Load the credential types a user puts in a file, without loading arbitrary configurations."""
    kind = info.get("type")
    if kind == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=_SCOPES)
    if kind == "authorized_user":
        from google.oauth2 import credentials

        return credentials.Credentials.from_authorized_user_info(info, scopes=_SCOPES)
    if kind == "external_account":  # workload identity federation (GitHub Actions, AWS...)
        if info.get("subject_token_type") == "urn:ietf:params:aws:token-type:aws4_request":
            from google.auth import aws

            return aws.Credentials.from_info(info, scopes=_SCOPES)
        if (info.get("credential_source") or {}).get("executable"):
            from google.auth import pluggable

            return pluggable.Credentials.from_info(info, scopes=_SCOPES)
        from google.auth import identity_pool

        return identity_pool.Credentials.from_info(info, scopes=_SCOPES)
    raise _UnsupportedCredentials(str(kind))


def _emulator_host() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as a URL, as the Google SDK reads it."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator and "://" not in emulator:
        emulator = "http://" + emulator  # "localhost:4443", as some tools write it
    return emulator or None


def from_uri(location: str, options: Mapping[str, Any], **kwargs: Any) -> GcsStore:
    """``bucket/prefix`` with the ``state_backend.gcs.*`` settings by short name."""
    bucket, prefix = split_location(location, "gs")
    credentials, project = _credentials(options)
    emulator = _emulator_host()
    try:
        if emulator:  # what the SDK does, but fixed now rather than read again later
            client = storage.Client(
                project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                credentials=credentials or AnonymousCredentials(),
                client_options={"api_endpoint": emulator},
            )
        else:
            client = storage.Client(project=project, credentials=credentials)
    except auth.DefaultCredentialsError:
        raise base.StoreAccessDenied(
            f"no Google credentials for gs://{location}: set {_SETTING}application_credentials_path "
            f"or {_SETTING}application_credentials_json, or configure Application Default Credentials"
        ) from None
    return GcsStore(client, bucket, prefix, **kwargs)


# What the type checker proves: the opener has the registry's signature, so the store it
# returns serves the whole interface.
_OPENER: base.Opener = from_uri
