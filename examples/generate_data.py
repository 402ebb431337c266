#!/usr/bin/env python3
"""Append N new rows to the demo data set read by tap-sample.

Each row is a JSON object ``{"id", "name", "value", "updated_at"}`` on its own line.
New rows get the next ids and ``updated_at`` values strictly newer than every row
already in the file (one second apart), so an incremental run of tap-sample picks up
exactly the rows appended since the previous run.

    python examples/generate_data.py --rows 100            # examples/data/events.jsonl
    python examples/generate_data.py --rows 5 --file /tmp/events.jsonl
    python examples/generate_data.py --reset --rows 10     # start a new file
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parent / "data" / "events.jsonl"
NAMES = ("signup", "login", "purchase", "refund", "logout", "upgrade")


def last_row(path: Path) -> dict | None:
    """The last non-empty line of the file, parsed (reads only the file's tail)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        chunk = 4096
        while True:
            start = max(0, size - chunk)
            fh.seek(start)
            lines = [ln for ln in fh.read(size - start).splitlines() if ln.strip()]
            if len(lines) > 1 or start == 0:
                return json.loads(lines[-1]) if lines else None
            chunk *= 2


def append_rows(path: Path, rows: int, seed: int | None = None) -> tuple[int, int]:
    """Append ``rows`` rows; return the first and last new id."""
    rng = random.Random(seed)
    previous = last_row(path)
    now = datetime.now(UTC).replace(microsecond=0)
    if previous is None:
        next_id, ts = 1, now - timedelta(seconds=rows)
    else:
        next_id = int(previous["id"]) + 1
        last_ts = datetime.fromisoformat(previous["updated_at"].replace("Z", "+00:00"))
        ts = max(last_ts + timedelta(seconds=1), now - timedelta(seconds=rows))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for i in range(rows):
            row = {
                "id": next_id + i,
                "name": rng.choice(NAMES),
                "value": round(rng.uniform(0, 1000), 2),
                "updated_at": (ts + timedelta(seconds=i)).isoformat(),
            }
            fh.write(json.dumps(row) + "\n")
    return next_id, next_id + rows - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", "-n", type=int, default=100, help="rows to append (100)")
    parser.add_argument("--file", "-f", type=Path, default=DEFAULT_FILE, help="data file")
    parser.add_argument("--reset", action="store_true", help="empty the file first")
    parser.add_argument("--seed", type=int, default=None, help="random seed for the values")
    parser.add_argument("--quiet", "-q", action="store_true")
    args = parser.parse_args(argv)
    if args.rows < 0:
        parser.error("--rows must be >= 0")
    if args.reset and args.file.exists():
        args.file.unlink()
    if args.rows == 0:
        return 0
    first, last = append_rows(args.file, args.rows, args.seed)
    if not args.quiet:
        print(f"appended {args.rows} rows (ids {first}..{last}) to {args.file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
