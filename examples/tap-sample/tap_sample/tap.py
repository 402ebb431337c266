"""The tap and its one stream, ``events``.

``events`` reads a local JSONL file (one object per line with ``id``, ``name``,
``value`` and ``updated_at``; ``examples/generate_data.py`` writes one) and replicates
it incrementally on ``updated_at``. Only rows strictly newer than the bookmark in
``--state`` are emitted, so a second run with the first run's state emits only the rows
added since.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from singer_sdk import Stream, Tap
from singer_sdk import typing as th


def _parse_ts(value: str) -> datetime:
    ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


class EventsStream(Stream):
    name = "events"
    primary_keys = ("id",)
    replication_key = "updated_at"
    is_sorted = True  # rows are emitted in updated_at order
    schema = th.PropertiesList(
        th.Property("id", th.IntegerType, required=True),
        th.Property("name", th.StringType),
        th.Property("value", th.NumberType),
        th.Property("updated_at", th.DateTimeType, required=True),
    ).to_dict()

    def __init__(self, tap: Tap) -> None:
        super().__init__(tap)
        frequency = self.config.get("state_message_frequency")
        if frequency:
            self.STATE_MSG_FREQUENCY = int(frequency)

    def get_records(self, context: dict | None) -> Iterable[dict[str, Any]]:
        path = Path(self.config["data_path"]).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"data_path {path} does not exist: generate it with examples/generate_data.py"
            )
        start = self.get_starting_replication_key_value(context)
        start_ts = _parse_ts(start) if start else None
        rows = []
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                row = json.loads(line)
                ts = _parse_ts(row["updated_at"])
                if start_ts is None or ts > start_ts:
                    rows.append((ts, row["id"], row))
        rows.sort(key=lambda r: (r[0], r[1]))
        for ts, _id, row in rows:
            yield {**row, "updated_at": ts.isoformat()}


class TapSample(Tap):
    """A small tap reading one incremental stream from a local JSONL file."""

    name = "tap-sample"
    config_jsonschema = th.PropertiesList(
        th.Property(
            "data_path",
            th.StringType,
            required=True,
            description="Path of the JSONL data file (see examples/generate_data.py).",
        ),
        th.Property(
            "start_date",
            th.DateTimeType,
            description="Emit only rows updated after this, when there is no bookmark.",
        ),
        th.Property(
            "state_message_frequency",
            th.IntegerType,
            description="Emit a STATE message every N records (default: the SDK's 10000).",
        ),
    ).to_dict()

    def discover_streams(self) -> list[Stream]:
        return [EventsStream(self)]


if __name__ == "__main__":
    TapSample.cli()
