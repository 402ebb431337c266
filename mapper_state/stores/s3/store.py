"""AWS S3 and S3-compatible stores (MinIO, R2, Ceph...) through boto3.

``s3://bucket/prefix``. Every write uses S3's own conditional requests: create is
``PutObject`` with ``If-None-Match: *``, replace is ``PutObject`` with ``If-Match:
<ETag>``, a versioned delete is ``DeleteObject`` with ``If-Match``. Some
S3-compatible stores accept these headers and ignore them; ``mapper-state doctor``
detects that. Some ignore ``If-Match`` on deletes only (MinIO, Ceph RGW): an
endpoint other than AWS is not taken to enforce it, so its leases are released by
compare-and-swap. Ceph RGW matches ``If-Match`` only against the ETag without its
quotes: a replace refused while the object is still at the version given is retried
unquoted, and the store remembers it for the endpoint (AWS is never second-guessed).

Versions are ETags. For a plain upload S3's ETag is the MD5 of the content, so
writing the very same bytes again keeps the same version: a compare-and-swap
cannot tell "unchanged" from "rewritten with identical bytes" (A-B-A). The layers
above make every lease write unique; a state rewritten with identical bytes is
harmless because its content is the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    InvalidRegionError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)
from urllib3.exceptions import HTTPError as _BodyError

from mapper_state.errors import ConfigError
from mapper_state.stores import base
from mapper_state.stores.cloud import CloudStore, Page, split_location
from mapper_state.stores.retry import RetryStats

_SETTING = "state_backend.s3."
_SSE_VALUES = ("AES256", "aws:kms", "aws:kms:dsse")
_ABSENT_CODES = {"NoSuchKey", "404", "NotFound"}
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_DENIED_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "403",
}
#: How long one attempt of each client may take (connecting, then reading); an attempt uses
#: the longest that fits the budget left.
_TIMEOUT_LADDER = (30.0, 10.0, 5.0, 2.0, 1.0, 0.5, 0.25)
_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestLimitExceeded",
}
_LAST_CHARACTER = "\U0010ffff"
_REGION_CODES = {
    "PermanentRedirect",
    "AuthorizationHeaderMalformed",
    "IllegalLocationConstraintException",
}


def _code_and_status(exc: ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return str(error.get("Code") or status), status


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, SSLError):
        return False  # a certificate problem does not go away by waiting
    if isinstance(exc, (ConnectionError, HTTPClientError, _BodyError)):
        return True  # _BodyError: the answer's body stalled or broke off while being read
    if isinstance(exc, ClientError):
        code, status = _code_and_status(exc)
        return status >= 500 or status == 429 or code in _THROTTLE_CODES
    return False


class S3Store(CloudStore):
    """Objects under ``prefix`` in one bucket; keys are relative to the prefix."""

    scheme = "s3"

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        write_args: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        client_for_timeout: Callable[[float], Any] | None = None,
        conditions_checked: bool = False,
        **kwargs: Any,
    ) -> None:
        # AWS refuses a DeleteObject whose If-Match does not match; S3-compatible stores
        # vary (MinIO and Ceph RGW ignore it), so an unknown endpoint is released by CAS
        super().__init__(
            bucket,
            prefix,
            enforces_delete_conditions=endpoint is None,
            proves_create_condition=endpoint is not None and not conditions_checked,
            **kwargs,
        )
        self._default_client = client
        self._client_for_timeout = client_for_timeout
        self._clients: dict[float, Any] = {}
        self._clients_lock = threading.Lock()
        self.bucket = bucket
        self.write_args = dict(write_args or {})
        self.endpoint = endpoint or "AWS S3"
        self.endpoint_is_aws = endpoint is None
        # traits.learned.unquoted_etags is learned on the first refused replace

    @property
    def client(self) -> Any:
        """A client whose timeouts fit the budget left: botocore fixes them per client, so
        there is one client per rung of :data:`_TIMEOUT_LADDER`, made when first needed."""
        if self._client_for_timeout is None:
            return self._default_client
        budget = self.budget()
        rung = next((t for t in _TIMEOUT_LADDER if t <= budget), _TIMEOUT_LADDER[-1])
        if rung >= self.read_timeout:
            return self._default_client
        with self._clients_lock:
            if rung not in self._clients:
                self._clients[rung] = self._client_for_timeout(rung)
            return self._clients[rung]

    def close(self) -> None:
        """Close the default client and every per-timeout one made for it."""
        with self._clients_lock:
            clients, self._clients = [*self._clients.values()], {}
        for client in (self._default_client, *clients):
            client.close()

    _is_transient = staticmethod(_is_transient)

    def _store_error(
        self, exc: Exception, op: str, where: str, stats: RetryStats
    ) -> base.StoreError | None:
        if isinstance(exc, ClientError):
            return self._client_error(exc, op, where)
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)):
            return base.StoreAccessDenied(
                f"no usable AWS credentials for {self.display_uri} ({type(exc).__name__}): set "
                f"{_SETTING}aws_access_key_id and {_SETTING}aws_secret_access_key, "
                "or configure the standard AWS credential chain"
            )
        if isinstance(exc, (ConnectionError, HTTPClientError, _BodyError)):
            return base.StoreError(
                f"cannot reach S3 at {self.endpoint} for {op} of {where}: "
                f"{type(exc).__name__}{stats.summary()}"
            )
        if isinstance(exc, BotoCoreError):
            return base.StoreError(f"S3 {op} of {where} failed: {type(exc).__name__}")
        return None

    def _client_error(self, exc: ClientError, op: str, where: str) -> base.StoreError:
        code, status = _code_and_status(exc)
        if code == "NoSuchBucket":
            return base.missing_bucket("S3 bucket", self.bucket, self.endpoint)
        if code in _CONFLICT_CODES or status in (409, 412):
            return base.PreconditionFailed(f"{where} changed or exists ({code})")
        if code in _DENIED_CODES or status == 403:
            return base.StoreAccessDenied(
                f"S3 refused {op} of {where}: {code} (check the credentials and permissions)"
            )
        if code in _REGION_CODES or status == 301:
            return base.StoreError(
                f"S3 bucket {self.bucket!r} is in another region: set {_SETTING}region ({code})"
            )
        if code == "NotImplemented" or status == 501:
            return base.StoreError(
                f"this S3 endpoint does not support {op} with conditions ({code}) at {where}"
            )
        return base.StoreError(f"S3 {op} of {where} failed: {code} (HTTP {status})")

    def _put(self, op: str, key: str, data: bytes, condition: dict[str, str]) -> str:
        full = self._key(key)

        def put() -> str:
            try:
                response = self.client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, **condition, **self.write_args
                )
            except ClientError as exc:
                if _code_and_status(exc)[0] in _ABSENT_CODES:  # If-Match on a deleted object
                    raise self._refused(key, "no longer exists") from None
                raise
            return str(response["ETag"])

        return self._conditional_write(op, key, data, put)

    def _list_page(self, prefix: str, token: str | None, after: str | None = None) -> Page:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if token:
            args["ContinuationToken"] = token
        if after:
            # S3 orders keys by their UTF-8 bytes: no name under ``after`` sorts past this one
            args["StartAfter"] = after + _LAST_CHARACTER
        if self.page_size:
            args["MaxKeys"] = self.page_size
        page = self.client.list_objects_v2(**args)
        entries = [
            (item["Key"], item["LastModified"].timestamp() if "LastModified" in item else None)
            for item in page.get("Contents", [])
        ]
        return entries, page.get("NextContinuationToken") if page.get("IsTruncated") else None

    # -- the interface -----------------------------------------------------------
    def read(self, key: str) -> base.Blob | None:
        full = self._key(key)

        def get() -> base.Blob | None:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                code, status = _code_and_status(exc)
                if code in _ABSENT_CODES or (status == 404 and code != "NoSuchBucket"):
                    return None
                raise
            with response["Body"] as body:
                return base.Blob(body.read(), str(response["ETag"]))

        return self._call("read", key, get)

    def create(self, key: str, data: bytes) -> str:
        return self._put("create", key, data, {"IfNoneMatch": "*"})

    def _if_match(self, version: str) -> str:
        return version.strip('"') if self.traits.learned.unquoted_etags.known else version

    def replace(self, key: str, data: bytes, if_version: str) -> str:
        sent = self._if_match(if_version)
        try:
            return self._put("replace", key, data, {"IfMatch": sent})
        except base.PreconditionFailed:
            # judged on what this call sent, not on the shared trait: another thread (the
            # heartbeat) may have learned unquoted ETags while this request was on the wire
            if self.endpoint_is_aws or not sent.startswith('"'):
                raise
            # Ceph RGW compares If-Match with its stored ETag, which has no quotes, and so
            # refuses the ETag exactly as S3 returned it. If the object is still at our
            # version, the refusal was that: from now on send ETags unquoted here.
            current = self.read(key)
            if current is None or current.version.strip('"') != if_version.strip('"'):
                raise
            self.traits.learned.unquoted_etags.learn()
            return self._put("replace", key, data, {"IfMatch": if_version.strip('"')})

    def delete(self, key: str, if_version: str | None = None) -> None:
        full = self._key(key)
        condition = {"IfMatch": self._if_match(if_version)} if if_version is not None else {}

        def delete() -> None:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=full, **condition)
            except ClientError as exc:
                code, status = _code_and_status(exc)
                absent = code in _ABSENT_CODES or (status == 404 and code != "NoSuchBucket")
                if absent and if_version is None:
                    return
                if absent:
                    raise self._refused(key, "no longer exists") from None
                if if_version is not None and (code == "NotImplemented" or status == 501):
                    self.traits.learned.refuses_delete_conditions.learn()  # it will not change
                    raise base.ConditionNotSupported(
                        self._client_error(exc, "delete", self._where(key)).message
                    ) from None
                raise

        self._call("delete", key, delete)


def _credentials(options: Mapping[str, Any]) -> dict[str, str]:
    """Explicit keys when given (both halves), else none: the standard AWS chain decides."""
    names = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
    given = {name: str(options[name]) for name in names if options.get(name)}
    for needed, needed_by in ((names[1], names[0]), (names[0], names[1]), (names[0], names[2])):
        if needed_by in given and needed not in given:
            raise ConfigError(f"setting {_SETTING}{needed} is missing (needed with {needed_by})")
    return given


def _write_args(options: Mapping[str, Any]) -> dict[str, str]:
    sse = options.get("server_side_encryption")
    kms_key = options.get("sse_kms_key_id")
    if kms_key and not sse:
        sse = "aws:kms"
    if sse and sse not in _SSE_VALUES:
        raise ConfigError(
            f"setting {_SETTING}server_side_encryption must be one of {', '.join(_SSE_VALUES)}, not {sse!r}"
        )
    if kms_key and not str(sse).startswith("aws:kms"):
        raise ConfigError(
            f"setting {_SETTING}sse_kms_key_id needs server_side_encryption aws:kms, not {sse}"
        )
    args = {"ServerSideEncryption": str(sse)} if sse else {}
    if kms_key:
        args["SSEKMSKeyId"] = str(kms_key)
    return args


def _is_aws(endpoint_url: str) -> bool:
    """Whether botocore's endpoint is AWS's own (``https://s3.<region>.amazonaws.com``)."""
    host = urlsplit(endpoint_url).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def from_uri(location: str, options: Mapping[str, Any], **kwargs: Any) -> S3Store:
    """``bucket/prefix`` with the ``state_backend.s3.*`` settings by short name."""
    bucket, prefix = split_location(location, "s3")
    endpoint = options.get("endpoint_url") or None
    if endpoint and not str(endpoint).startswith(("http://", "https://")):
        raise ConfigError(f"setting {_SETTING}endpoint_url must start with http:// or https://")
    checksums: Literal["when_required", "when_supported"] = (
        "when_required" if endpoint else "when_supported"  # some S3-compatibles refuse them
    )

    def config(attempt_seconds: float) -> Config:
        return Config(
            # one retry layer: the store's own, within its deadline
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=min(5.0, attempt_seconds / 2),
            read_timeout=attempt_seconds if attempt_seconds >= 30 else attempt_seconds / 2,
            user_agent_extra="mapper-state",
            request_checksum_calculation=checksums,
            response_checksum_validation=checksums,
        )

    credentials = _credentials(options)
    session = boto3.session.Session(
        aws_access_key_id=credentials.get("aws_access_key_id"),
        aws_secret_access_key=credentials.get("aws_secret_access_key"),
        aws_session_token=credentials.get("aws_session_token"),
        region_name=options.get("region") or None,
    )

    def client_for_timeout(attempt_seconds: float) -> Any:
        try:
            return session.client("s3", endpoint_url=endpoint, config=config(attempt_seconds))
        except InvalidRegionError:
            raise ConfigError(
                f"setting {_SETTING}region (or AWS_REGION) is not a region name: "
                f"{session.region_name!r}"
            ) from None
        except ValueError as exc:  # botocore's "Invalid endpoint: ..."
            raise ConfigError(f"setting {_SETTING}endpoint_url is not usable: {exc}") from None

    client = client_for_timeout(30.0)
    if endpoint is None and not _is_aws(client.meta.endpoint_url):
        # AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or a profile's endpoint_url: botocore's choice
        # is the endpoint, named in errors and not taken for AWS
        endpoint = client.meta.endpoint_url
    return S3Store(
        client,
        bucket,
        prefix,
        write_args=_write_args(options),
        endpoint=endpoint,
        client_for_timeout=client_for_timeout,
        conditions_checked=str(options.get("conditional_writes_checked", "")).lower()
        in ("true", "1", "yes"),
        **kwargs,
    )


# What the type checker proves: the opener has the registry's signature, so the store it
# returns serves the whole interface.
_OPENER: base.Opener = from_uri
