"""Azure Blob Storage through azure-storage-blob.

``azure://container/prefix``. Create is an upload with ``If-None-Match: *``
(``overwrite=False``), replace an upload with ``If-Match: <ETag>``, a versioned
delete a delete with ``If-Match``. Azure gives every write a new ETag, even when
the bytes are the same.

Credentials: ``state_backend.azure.connection_string``, else
``state_backend.azure.storage_account_url`` with ``DefaultAzureCredential``
(environment, workload or managed identity, Azure CLI...), else the
``AZURE_STORAGE_CONNECTION_STRING`` environment variable as Meltano does.
The SDK's own retries are off: :func:`retrying` owns them, so a write whose
response was lost is known to be ambiguous and checked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient

from mapper_state.errors import ConfigError
from mapper_state.stores import base
from mapper_state.stores.cloud import CloudStore, Page, split_location
from mapper_state.stores.retry import RetryStats

_SETTING = "state_backend.azure."
_MISSING_CONTAINER = "ContainerNotFound"
_CLIENT_ARGS: dict[str, Any] = {"retry_total": 0, "connection_timeout": 5, "read_timeout": 30}


def _status(exc: BaseException) -> int:
    return int(getattr(exc, "status_code", None) or 0)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ClientAuthenticationError):
        return False
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return True  # connection refused or reset, timeouts
    if isinstance(exc, HttpResponseError):
        return _status(exc) >= 500 or _status(exc) in (408, 429)
    return False


class AzureBlobStore(CloudStore):
    """Blobs under ``prefix`` in one container; keys are relative to the prefix."""

    scheme = "azure"
    # List Blobs has no start key (its marker is opaque; the SDK's ``start_from`` needs an
    # API version Azurite lacks): an excluded range is paged through and filtered out.
    can_skip = False

    def __init__(
        self,
        container: ContainerClient,
        prefix: str = "",
        *,
        service: BlobServiceClient | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(container.container_name, prefix, **kwargs)
        self.container = container
        self._service = service  # the client that made ``container``: it owns the transport

    def close(self) -> None:
        self.container.close()
        if self._service is not None:
            self._service.close()

    _is_transient = staticmethod(_is_transient)

    def _store_error(
        self, exc: Exception, op: str, where: str, stats: RetryStats
    ) -> base.StoreError | None:
        if isinstance(exc, ClientAuthenticationError):
            return base.StoreAccessDenied(
                f"Azure refused {op} of {where}: {type(exc).__name__}{_code(exc)} "
                f"(check {_SETTING}connection_string or the Azure credential's role)"
            )
        if isinstance(exc, ResourceNotFoundError):
            if getattr(exc, "error_code", None) == _MISSING_CONTAINER:
                return self._missing_container()
            return base.StoreError(f"Azure {op} of {where} failed: not found{_code(exc)}")
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return base.StoreError(
                f"cannot reach Azure Blob Storage at {self.container.primary_hostname} for {op} "
                f"of {where}: {type(exc).__name__}{stats.summary()}"
            )
        if isinstance(exc, HttpResponseError):
            if _status(exc) == 403:
                return base.StoreAccessDenied(f"Azure refused {op} of {where}{_code(exc)}")
            return base.StoreError(
                f"Azure {op} of {where} failed: HTTP {_status(exc)}{_code(exc)}{stats.summary()}"
            )
        if isinstance(exc, AzureError):
            return base.StoreError(f"Azure {op} of {where} failed: {type(exc).__name__}")
        return None

    def _per_call(self) -> dict[str, Any]:
        """This attempt's transport timeouts, cut to the budget left."""
        connect, read = self.timeouts()
        return {"connection_timeout": connect, "read_timeout": read}

    def _missing_container(self) -> base.StoreError:
        name = self.container.container_name
        return base.missing_bucket("Azure container", name, self.container.primary_hostname)

    def _write(self, op: str, key: str, data: bytes, **conditions: Any) -> str:
        blob = self.container.get_blob_client(self._key(key))

        def upload() -> str:
            try:
                return str(blob.upload_blob(data, **conditions, **self._per_call())["etag"])
            except (ResourceExistsError, ResourceModifiedError):
                raise self._refused(key, "changed or exists") from None
            except ResourceNotFoundError as exc:
                if getattr(exc, "error_code", None) == _MISSING_CONTAINER:
                    raise
                raise self._refused(key, "no longer exists") from None

        return self._conditional_write(op, key, data, upload)

    # -- the interface -----------------------------------------------------------
    def read(self, key: str) -> base.Blob | None:
        blob = self.container.get_blob_client(self._key(key))

        def download() -> base.Blob | None:
            try:
                downloader = blob.download_blob(**self._per_call())
                data = downloader.readall()
            except ResourceNotFoundError as exc:
                if getattr(exc, "error_code", None) == _MISSING_CONTAINER:
                    raise
                return None
            return base.Blob(data, str(downloader.properties.etag))

        return self._call("read", key, download)

    def create(self, key: str, data: bytes) -> str:
        return self._write("create", key, data, overwrite=False)

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        return self._write(
            "replace",
            key,
            data,
            overwrite=True,
            etag=if_version,
            match_condition=MatchConditions.IfNotModified,
        )

    def delete(self, key: str, if_version: str | None = None) -> None:
        blob = self.container.get_blob_client(self._key(key))
        conditions: dict[str, Any] = {}
        if if_version is not None:
            conditions = {"etag": if_version, "match_condition": MatchConditions.IfNotModified}

        def delete() -> None:
            try:
                blob.delete_blob(**conditions, **self._per_call())
            except ResourceModifiedError:
                raise self._refused(key, "changed") from None
            except ResourceNotFoundError as exc:
                if getattr(exc, "error_code", None) == _MISSING_CONTAINER:
                    raise
                if if_version is not None:
                    raise self._refused(key, "no longer exists") from None

        self._call("delete", key, delete)

    def _list_page(self, prefix: str, token: str | None, after: str | None = None) -> Page:
        pages = self.container.list_blobs(
            name_starts_with=prefix, results_per_page=self.page_size, **self._per_call()
        ).by_page(continuation_token=token)
        entries = [
            (item.name, item.last_modified.timestamp() if item.last_modified else None)
            for item in next(pages, [])
        ]
        # by_page() is typed as a plain iterator; at run time it is a PageIterator
        token_after: str | None = getattr(pages, "continuation_token", None)
        return entries, token_after


def _code(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None)
    return f" ({code})" if code else ""


def _service_client(options: Mapping[str, Any]) -> BlobServiceClient:
    connection_string = options.get("connection_string")
    account_url = options.get("storage_account_url")
    if not connection_string and not account_url:
        connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection_string:
        try:
            return BlobServiceClient.from_connection_string(str(connection_string), **_CLIENT_ARGS)
        except ValueError:
            raise ConfigError(
                f"setting {_SETTING}connection_string is not a valid Azure Storage connection string"
            ) from None
    if not account_url:
        raise ConfigError(
            f"setting {_SETTING}connection_string or {_SETTING}storage_account_url is required "
            "for azure:// URIs"
        )
    if not str(account_url).startswith("https://"):  # the SDK sends tokens over HTTPS only
        raise ConfigError(f"setting {_SETTING}storage_account_url must start with https://")
    try:
        from azure.identity import DefaultAzureCredential  # heavy: only when it is used
    except ImportError:
        raise ConfigError(
            f"setting {_SETTING}storage_account_url needs azure-identity "
            "(pip install 'mapper-state[azure]')"
        ) from None
    # the credential chain logs a multi-line warning per identity it tries; our own
    # one-line error says what failed
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    return BlobServiceClient(str(account_url), credential=DefaultAzureCredential(), **_CLIENT_ARGS)


def from_uri(location: str, options: Mapping[str, Any], **kwargs: Any) -> AzureBlobStore:
    """``container/prefix`` with the ``state_backend.azure.*`` settings by short name."""
    container, prefix = split_location(location, "azure", "container")
    client = _service_client(options)
    return AzureBlobStore(client.get_container_client(container), prefix, service=client, **kwargs)


# What the type checker proves: the opener has the registry's signature, so the store it
# returns serves the whole interface.
_OPENER: base.Opener = from_uri
