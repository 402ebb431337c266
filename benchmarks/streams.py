"""The Singer streams the filter benchmarks pump, written to files once per run.

* ``plain``: ~200-byte RECORD lines with a STATE every 10,000 lines, the everyday shape;
* ``state_text``: the same, but every record holds the value ``"STATE"``, so every line
  is a STATE candidate the pump must look at (the worst case for its scan);
* ``huge_line``: one RECORD line of many MB between a SCHEMA and a STATE;
* ``every_state``: a STATE after every record (the checkpointer must coalesce).
"""

from __future__ import annotations

from pathlib import Path

BLOCK = 10_000  # lines generated and written at a time
SCHEMA = '{"type":"SCHEMA","stream":"events","schema":{"type":"object"},"key_properties":["id"]}\n'
_PAD = "x" * 41  # a record line is then 200 bytes or so


def _record(i: int, status: str = "ok") -> str:
    return (
        f'{{"type":"RECORD","stream":"events","record":{{"id":{i},"name":"{_PAD}",'
        f'"status":"{status}","updated_at":"2024-01-01T00:00:00Z"}},'
        '"time_extracted":"2024-01-01T00:00:00Z"}\n'
    )


def _state(i: int) -> str:
    return (
        '{"type":"STATE","value":{"bookmarks":{"events":'
        f'{{"replication_key":"updated_at","replication_key_value":{i}}}}}}}}}\n'
    )


def plain(path: Path, lines: int, *, status: str = "ok") -> Path:
    """``lines`` lines: a SCHEMA, then RECORDs with a STATE every 10,000 lines."""
    with path.open("w") as f:
        f.write(SCHEMA)
        for start in range(1, lines, BLOCK):
            f.write(
                "".join(
                    _state(i) if i % BLOCK == 0 else _record(i, status)
                    for i in range(start, min(start + BLOCK, lines))
                )
            )
    return path


def state_text(path: Path, lines: int) -> Path:
    """Like :func:`plain`, but every record contains the text ``"STATE"``."""
    return plain(path, lines, status="STATE")


def huge_line(path: Path, megabytes: int) -> Path:
    """A SCHEMA, one RECORD line of ``megabytes`` MB (no STATE text in it), a STATE."""
    head = '{"type":"RECORD","stream":"events","record":{"id":1,"blob":"'
    tail = '"}}\n'
    chunk = "y" * (1 << 20)
    with path.open("w") as f:
        f.write(SCHEMA)
        f.write(head)
        for _ in range(megabytes):
            f.write(chunk)
        f.write(tail)
        f.write(_state(1))
    return path


def every_state(path: Path, lines: int) -> Path:
    """A SCHEMA, then ``lines`` lines alternating a RECORD and a STATE bookmarking it."""
    with path.open("w") as f:
        f.write(SCHEMA)
        for start in range(1, lines // 2 + 1, BLOCK):
            end = min(start + BLOCK, lines // 2 + 1)
            f.write("".join(_record(i) + _state(i) for i in range(start, end)))
    return path


def megabytes(path: Path) -> float:
    return path.stat().st_size / 1e6
