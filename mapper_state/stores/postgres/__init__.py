"""PostgreSQL: the declaration (schemes, settings); psycopg lives in the other modules.

Only this declaration is imported to list settings; :mod:`.store` (with :mod:`.connection`,
:mod:`.errors`, :mod:`.schema` and psycopg) is imported when a ``postgresql://`` or
``postgres://`` URI is opened.
"""

from __future__ import annotations

from mapper_state.settings import SettingSpec
from mapper_state.stores.base import StoreType

STORE = StoreType(
    section="postgres",
    schemes=("postgresql", "postgres"),
    opener="mapper_state.stores.postgres.store:from_uri",
    retries=True,
    description="`postgresql://user@host:port/dbname` (`?schema=`, `?table=`): one table in a "
    "PostgreSQL database, through psycopg.",
    extra="postgres",
    secret_env_vars=("PGPASSWORD",),
    settings=(
        SettingSpec(
            "password",
            "string",
            "PostgreSQL password, when the URI has none (else libpq's own: `PGPASSWORD`, "
            "`~/.pgpass`, a service file).",
            secret=True,
        ),
    ),
)
