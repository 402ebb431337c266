"""The Azure Blob store against Azurite: the contracts, plus what only Azure promises."""

from __future__ import annotations

import re
import time

import pytest
from azure.storage.blob import BlobServiceClient

from mapper_state.errors import ConfigError
from mapper_state.stores import open_store
from mapper_state.stores.azure.store import from_uri
from mapper_state.stores.base import StoreAccessDenied
from tests.contract.location_contract import OnEmulator, PrefixContract
from tests.servers import AZURITE_KEY, StoreLocation, free_port
from tests.stores import wire_checks

pytestmark = pytest.mark.cloud


def connection_string(
    location: StoreLocation, port: int | None = None, key: str = AZURITE_KEY
) -> str:
    text = location.options["connection_string"].replace(AZURITE_KEY, key)
    return re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", text) if port else text


def container_blobs(location: StoreLocation) -> list[str]:
    service = BlobServiceClient.from_connection_string(location.options["connection_string"])
    return sorted(b.name for b in service.get_container_client(location.bucket).list_blobs())


def test_list_follows_pagination(azure_location: StoreLocation) -> None:
    store = from_uri(azure_location.uri.split("://", 1)[1], azure_location.options, page_size=4)
    neighbour = from_uri(
        f"{azure_location.bucket}/{azure_location.prefix}ful", azure_location.options
    )
    wire_checks.check_list_follows_pagination(store, neighbour)


def test_missing_container_is_a_clear_error(azure_location: StoreLocation) -> None:
    wire_checks.check_a_missing_bucket_is_a_clear_error(
        azure_location.open("azure://no-such-container/p"),
        "Azure container 'no-such-container' does not exist",
    )


def test_wrong_account_key_is_one_line_without_the_secret(azure_location: StoreLocation) -> None:
    wrong_key = "d3Jvbmcta2V5LXZhbHVlLXRoYXQtaXMtbG9uZy1lbm91Z2gtdG8tbG9vay1yZWFs"
    options = {"connection_string": connection_string(azure_location, key=wrong_key)}
    with pytest.raises(StoreAccessDenied) as caught:
        open_store(azure_location.uri, {"azure": options}).read("id/state.json")
    message = caught.value.message
    assert "Azure refused read" in message
    assert "\n" not in message
    assert wrong_key not in message
    assert "AccountKey" not in message


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "state_backend.azure.connection_string or state_backend.azure.storage_account_url"),
        (
            {"connection_string": "AccountKey=s3cr3t;nonsense"},
            "state_backend.azure.connection_string",
        ),
        (
            {"storage_account_url": "myaccount.blob.core.windows.net"},
            "state_backend.azure.storage_account_url",
        ),
        (
            {"storage_account_url": "http://myaccount.blob.core.windows.net"},
            "state_backend.azure.storage_account_url",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    options: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError) as caught:
        open_store("azure://container/prefix", {"azure": options})
    assert named in caught.value.message
    assert "s3cr3t" not in caught.value.message


def test_uri_without_container_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"state_backend\.uri"):
        open_store("azure://", {"azure": {"connection_string": "x"}})


def test_connection_string_from_the_environment_as_meltano_reads_it(
    azure_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", azure_location.options["connection_string"]
    )
    open_store(azure_location.uri, {"azure": {}}).create("id/state.json", b"{}")
    assert container_blobs(azure_location) == [f"{azure_location.prefix}/id/state.json"]


def test_unreachable_endpoint_fails_in_bounded_time(azure_location: StoreLocation) -> None:
    options = {"connection_string": connection_string(azure_location, port=free_port())}
    store = from_uri(f"{azure_location.bucket}/p", options, retry_deadline_seconds=1)
    message = wire_checks.unreachable_error(store)
    assert "cannot reach Azure Blob Storage at 127.0.0.1" in message
    assert AZURITE_KEY not in message


def test_opening_other_stores_imports_no_azure_sdk() -> None:
    wire_checks.check_other_stores_import_no_sdk("azure")


def test_account_url_without_an_azure_identity_is_access_denied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(
        "IDENTITY_ENDPOINT", f"http://127.0.0.1:{free_port()}"
    )  # no managed identity
    monkeypatch.setenv("IMDS_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    options = {"storage_account_url": f"https://127.0.0.1:{free_port()}/devstoreaccount1"}
    started = time.monotonic()
    with pytest.raises(StoreAccessDenied) as caught:
        open_store("azure://container/p", {"azure": options}).read("id/state.json")
    assert "Azure refused read" in caught.value.message
    assert "\n" not in caught.value.message
    assert time.monotonic() - started < 20


# -- the contracts -----------------------------------------------------------------------


class TestAzureStore(OnEmulator, PrefixContract, wire_checks.BadWireContract):
    list_bucket = staticmethod(container_blobs)

    @pytest.fixture
    def location(self, azure_location: StoreLocation) -> StoreLocation:
        return azure_location
