"""SDK clients on the emulators, built from an emulator's ``options`` (the store settings).

boto3 is imported when a client is made, as the stores import their SDKs: collecting the
tests does not pay for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
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
