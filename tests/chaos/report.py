"""Print the figures a chaos run recorded (``MAPPER_STATE_CHAOS_REPORT``) as a Markdown table.

``python -m tests.chaos.report FILE``: one row per recorded test and store, the counts
added up over the rows of the same test, store and fault setting.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

SKIP = {"test", "store", "budget"}
#: Figures that name a variant of a test rather than count something: rows differ by them.
KEYS = ("faults", "holder_skew", "contender_skew")


def merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge(a.get(k), b.get(k)) for k in {*a, *b}}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a + b
    if a is None:
        return b
    if b is None:
        return a
    return a if a == b else f"{a}; {b}"


def fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def main(path: str) -> int:
    rows: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(dict)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        raw = json.loads(line)
        key = (raw["test"], raw["store"], json.dumps([raw.get(k) for k in KEYS]))
        figures = {k: v for k, v in raw.items() if k not in SKIP}
        rows[key] = merge(rows[key], figures) if rows[key] else figures
    print("| test | store | figures |")
    print("|---|---|---|")
    for (test, store, _), figures in sorted(rows.items()):
        print(f"| {test} | {store} | {fmt(figures)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
