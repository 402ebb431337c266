"""Google Cloud Storage: the declaration (schemes, settings); the Google SDK lives in ``store``."""

from __future__ import annotations

from mapper_state.settings import SettingSpec
from mapper_state.stores.base import StoreType

STORE = StoreType(
    section="gcs",
    schemes=("gs", "gcs"),
    opener="mapper_state.stores.gcs.store:from_uri",
    retries=True,
    description="`gs://bucket/prefix`: Google Cloud Storage, through google-cloud-storage.",
    extra="gcs",
    settings=(
        SettingSpec(
            "application_credentials_path",
            "string",
            "Path of a Google service-account credentials file.",
        ),
        SettingSpec(
            "application_credentials_json",
            "string",
            "Google service-account credentials as JSON.",
            secret=True,
            accepts_object=True,
        ),
    ),
    meltano_aliases={"application_credentials": "application_credentials_path"},
)
