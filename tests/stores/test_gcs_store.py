"""The GCS store against fake-gcs-server: the contracts, plus what only GCS promises.

fake-gcs-server ignores preconditions on DELETE (measured below); its ``Emulator`` says
so, and the contract class hands that on, so the contracts skip those two checks. gcp-storage-emulator
ignores every precondition: it is here to show the store is unsafe there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mapper_state.errors import ConfigError
from mapper_state.stores import open_store
from mapper_state.stores.base import PreconditionFailed, StoreAccessDenied
from mapper_state.stores.gcs.store import from_uri
from tests.contract.location_contract import OnEmulator, PrefixContract
from tests.servers import StoreLocation, free_port
from tests.stores import wire_checks
from tests.support.sdk import gcs_client

pytestmark = pytest.mark.cloud


def bucket_objects(location: StoreLocation) -> list[str]:
    client = gcs_client(location.emulator.endpoint)
    return sorted(b.name for b in client.list_blobs(location.bucket))


def test_list_follows_pagination(
    gcs_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_location.emulator.endpoint)
    store = from_uri(f"{gcs_location.bucket}/{gcs_location.prefix}", {}, page_size=4)
    wire_checks.check_list_follows_pagination(store, gcs_location.open(f"{gcs_location.uri}ful"))


def test_versions_are_generations(gcs_location: StoreLocation) -> None:
    store = gcs_location.open()
    v1 = store.create("id/state.json", b"1")
    v2 = store.replace("id/state.json", b"1", if_version=v1)
    assert v1.isdigit()
    assert v2.isdigit()
    assert int(v2) > int(v1)


def test_missing_bucket_is_a_clear_error(gcs_location: StoreLocation) -> None:
    wire_checks.check_a_missing_bucket_is_a_clear_error(
        gcs_location.open("gs://no-such-bucket/p"), "bucket 'no-such-bucket' does not exist"
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"application_credentials_json": "{not json s3cr3t"}, "application_credentials_json"),
        (
            {"application_credentials_json": '{"type": "nonsense", "k": "s3cr3t"}'},
            "application_credentials_json",
        ),
        ({"application_credentials_path": "/nonexistent/key.json"}, "application_credentials_path"),
        (
            {"application_credentials_path": "/x.json", "application_credentials_json": "{}"},
            "application_credentials_json",
        ),
    ],
)
def test_bad_credentials_settings_name_the_setting_not_the_secret(
    options: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store("gs://bucket/prefix", {"gcs": options})
    assert f"state_backend.gcs.{named}" in caught.value.message
    assert "s3cr3t" not in caught.value.message
    assert "\n" not in caught.value.message


def test_credentials_file_is_read(tmp_path: Path, gcs_location: StoreLocation) -> None:
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"type": "service_account", "private_key": "s3cr3t"}))
    with pytest.raises(ConfigError) as caught:  # the file is read and found unusable
        gcs_location.open(application_credentials_path=str(path))
    assert "state_backend.gcs.application_credentials_path" in caught.value.message
    assert "s3cr3t" not in caught.value.message


def test_no_credentials_at_all_is_access_denied(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{free_port()}")
    with pytest.raises(
        StoreAccessDenied, match=r"state_backend\.gcs\.application_credentials_path"
    ):
        open_store("gs://bucket/prefix", {"gcs": {}})


def test_unreachable_endpoint_fails_in_bounded_time(
    gcs_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    store = from_uri(f"{gcs_location.bucket}/p", {}, retry_deadline_seconds=1)
    assert f"cannot reach Google Cloud Storage at {endpoint}" in wire_checks.unreachable_error(
        store
    )


def test_fake_gcs_server_ignores_delete_preconditions_only(gcs_location: StoreLocation) -> None:
    """Measures what the fixture claims; if this fails, fake-gcs-server changed: update it."""
    store = gcs_location.open()
    v1 = store.create("k", b"1")
    with pytest.raises(PreconditionFailed):
        store.create("k", b"2")
    store.replace("k", b"3", if_version=v1)
    with pytest.raises(PreconditionFailed):
        store.replace("k", b"4", if_version=v1)
    store.delete("k", if_version=v1)  # stale: GCS would refuse it
    assert store.read("k") is None


def test_gcp_storage_emulator_ignores_every_precondition(
    gcs_unsafe_location: StoreLocation,
) -> None:
    """The store sends the preconditions; this server accepts and ignores them."""
    store = gcs_unsafe_location.open()
    v1 = store.create("k", b"1")
    store.create("k", b"2")  # GCS: 412
    store.replace("k", b"3", if_version=v1)  # GCS: 412
    blob = store.read("k")
    assert blob is not None
    assert blob.data == b"3"
    assert blob.version != v1


def test_opening_other_stores_imports_no_google_sdk() -> None:
    wire_checks.check_other_stores_import_no_sdk("google")


# -- the contracts -----------------------------------------------------------------------


class TestGcsStore(OnEmulator, PrefixContract, wire_checks.BadWireContract):
    list_bucket = staticmethod(bucket_objects)

    @pytest.fixture
    def location(self, gcs_location: StoreLocation) -> StoreLocation:
        return gcs_location
