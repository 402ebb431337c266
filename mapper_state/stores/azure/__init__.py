"""Azure Blob Storage: the declaration (schemes, settings); the Azure SDK lives in ``store``."""

from __future__ import annotations

from mapper_state.settings import SettingSpec
from mapper_state.stores.base import StoreType

STORE = StoreType(
    section="azure",
    schemes=("azure", "az"),
    opener="mapper_state.stores.azure.store:from_uri",
    retries=True,
    description="`azure://container/prefix`: Azure Blob Storage, through azure-storage-blob.",
    extra="azure",
    secret_env_vars=("AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_KEY"),
    settings=(
        SettingSpec("connection_string", "string", "Azure Storage connection string.", secret=True),
        SettingSpec(
            "storage_account_url",
            "string",
            "Azure Storage account URL, used with the default Azure credential.",
        ),
    ),
)
