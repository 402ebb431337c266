"""AWS S3 and S3-compatible stores: the declaration (schemes, settings); boto3 lives in ``store``.

Only this declaration is imported to list settings; :mod:`.store` (and boto3) is
imported when an ``s3://`` URI is opened.
"""

from __future__ import annotations

from mapper_state.settings import SettingSpec
from mapper_state.stores.base import StoreType

STORE = StoreType(
    section="s3",
    schemes=("s3",),
    opener="mapper_state.stores.s3.store:from_uri",
    retries=True,
    description="`s3://bucket/prefix`: AWS S3 or an S3-compatible store, through boto3.",
    extra="s3",
    secret_env_vars=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    settings=(
        SettingSpec("aws_access_key_id", "string", "AWS access key ID.", secret=True),
        SettingSpec("aws_secret_access_key", "string", "AWS secret access key.", secret=True),
        SettingSpec("aws_session_token", "string", "AWS session token.", secret=True),
        SettingSpec(
            "endpoint_url", "string", "Endpoint of an S3-compatible store (MinIO, R2, Ceph...)."
        ),
        SettingSpec("region", "string", "AWS region of the bucket."),
        SettingSpec(
            "server_side_encryption",
            "string",
            "Server-side encryption for every write: `AES256` or `aws:kms`.",
        ),
        SettingSpec("sse_kms_key_id", "string", "KMS key ID for `aws:kms` encryption."),
        SettingSpec(
            "conditional_writes_checked",
            "boolean",
            "The `endpoint_url` store is known to refuse a second `If-None-Match: *` create "
            "(`mapper-state doctor` says SAFE): skip the check every lease acquire makes there.",
            default=False,
        ),
    ),
)
