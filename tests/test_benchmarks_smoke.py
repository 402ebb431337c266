"""The scoreboard runs end to end on tiny sizes and produces every figure and picture.

Why it exists: ``make bench`` takes minutes and is not part of CI, so without this a
change could quietly break a benchmark (a renamed flag, a moved file, a tool's new
output) until the next time someone measures. Each test runs one section, ``python -m
benchmarks.run --scale tiny --only <section>``, against the real tools (Meltano,
target-jsonl, mitmproxy, moto) into a temporary directory and checks that it wrote its
results and drew its pictures (one section per test, so the suite runs them side by
side). It asserts nothing about speed: tiny sizes measure nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.plots import PICTURES
from benchmarks.run import SECTIONS
from tests.helpers import clean_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


#: What each section's promise is judged by: a figure and a verdict, checked per section.
def _filter(data: dict[str, Any]) -> None:
    assert {"cat", "mapper-state", "meltano-map-transform"} <= set(data["slope"]["contenders"])
    assert set(data["every_state"]["runs"]) == {"5", "0"}


def _pipeline(data: dict[str, Any]) -> None:
    assert len(data["contenders"]) == 4


def _fleet(data: dict[str, Any]) -> None:
    assert data["pipelines_with_exactly_one_run"] == data["pipelines"]
    assert data["refused"] == data["pipelines"] * (data["replicas"] - 1)


def _operator(data: dict[str, Any]) -> None:
    commands = {r["command"] for r in data["results"]}
    assert {"mapper-state state export", "meltano state list", "meltano state get"} <= commands


JUDGED_BY: dict[str, Callable[[dict[str, Any]], None]] = {
    "filter": _filter,
    "pipeline": _pipeline,
    "fleet": _fleet,
    "operator": _operator,
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_benchmark_and_picture_is_produced(tmp_path: Path, name: str) -> None:
    """One section at a time (``--only``), so the sections run side by side in the suite."""
    out = tmp_path / "results"
    result = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.run",
            "--scale", "tiny", "--only", name, "--out", str(out),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == {}
    assert summary["sections"] == [name]
    drawn = [picture for picture, (source, _) in PICTURES.items() if source == name]
    assert summary["pictures"] == drawn
    scoreboard = (out / "scoreboard.md").read_text()
    section = json.loads((out / f"{name}.json").read_text())
    assert section["rows"], f"{name} measured nothing"
    assert section["data"], f"{name} kept no figures"
    assert f"#### {section['title']}" in scoreboard
    for row in section["rows"]:
        assert row["measure"].replace("|", "\\|") in scoreboard  # escaped in tables
    for picture in drawn:
        data = (out / picture).read_bytes()
        assert data.startswith(PNG_MAGIC), picture
        assert len(data) > 10_000, picture
        assert f"]({picture})" in scoreboard
    if name in JUDGED_BY:
        JUDGED_BY[name](section["data"])


def test_every_picture_comes_from_a_section() -> None:
    assert {source for source, _ in PICTURES.values()} <= set(SECTIONS)
