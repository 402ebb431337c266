"""SDK clients on the emulators, built from an emulator's ``options`` (the store settings).

The SDKs are imported when a client is made, as the stores import theirs: collecting the
tests does not pay for them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any


def s3_client(options: Mapping[str, str], *, endpoint_url: str | None = None, **config: Any) -> Any:
    """A boto3 S3 client with the emulator's endpoint (or ``endpoint_url``: a proxy in front)
    and credentials; ``config`` goes to botocore's ``Config`` (retries, timeouts)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or options["endpoint_url"],
        region_name=options["region"],
        aws_access_key_id=options["aws_access_key_id"],
        aws_secret_access_key=options["aws_secret_access_key"],
        config=Config(**config) if config else None,
    )


def new_bucket(options: Mapping[str, str], prefix: str = "bucket") -> str:
    """Create a bucket of a name no other test uses, on the S3 server of ``options``."""
    bucket = f"{prefix}-{uuid.uuid4().hex[:16]}"
    s3_client(options).create_bucket(Bucket=bucket)
    return bucket


def gcs_client(endpoint: str) -> Any:
    """A google-cloud-storage client of a GCS emulator at ``endpoint``, anonymous."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def object_reader(
    section: str, options: Mapping[str, str], endpoint: str, bucket: str, prefix: str
) -> Callable[[str], bytes | None]:
    """A reader of the objects under ``bucket/prefix`` through the store's own SDK (not
    mapper-state's): ``read(key)`` is the object's bytes, or None when there is none."""
    if section == "s3":
        client = s3_client(options)

        def read_s3(key: str) -> bytes | None:
            try:
                obj = client.get_object(Bucket=bucket, Key=f"{prefix}/{key}")
            except client.exceptions.NoSuchKey:
                return None
            data: bytes = obj["Body"].read()
            return data

        return read_s3
    if section == "azure":
        from azure.core.exceptions import ResourceNotFoundError
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(options["connection_string"])
        container = service.get_container_client(bucket)

        def read_azure(key: str) -> bytes | None:
            try:
                return container.download_blob(f"{prefix}/{key}").readall()
            except ResourceNotFoundError:
                return None

        return read_azure
    if section == "gcs":
        from google.api_core.exceptions import NotFound

        gcs = gcs_client(endpoint).bucket(bucket)

        def read_gcs(key: str) -> bytes | None:
            try:
                data: bytes = gcs.blob(f"{prefix}/{key}").download_as_bytes()
            except NotFound:
                return None
            return data

        return read_gcs
    raise ValueError(f"no reader for the {section!r} section")
