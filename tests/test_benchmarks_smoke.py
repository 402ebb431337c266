"""The scoreboard runs end to end on tiny sizes and produces every figure and picture.

Why it exists: ``make bench`` takes minutes and is not part of CI, so without this a
change could quietly break a benchmark (a renamed flag, a moved file, a tool's new
output) until the next time someone measures. It runs ``python -m benchmarks.run
--scale tiny`` against the real tools (Meltano, target-jsonl, mitmproxy, moto) into a
temporary directory and checks that every section wrote its results and every
picture was drawn. It asserts nothing about speed: tiny sizes measure nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.plots import PICTURES
from benchmarks.run import SECTIONS
from tests.helpers import clean_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(1200)
def test_every_benchmark_and_picture_is_produced(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--scale", "tiny", "--out", str(out)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=1150,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-5000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == {}
    assert summary["sections"] == list(SECTIONS)
    assert summary["pictures"] == list(PICTURES)
    scoreboard = (out / "scoreboard.md").read_text()
    for name in SECTIONS:
        section = json.loads((out / f"{name}.json").read_text())
        assert section["rows"], f"{name} measured nothing"
        assert section["data"], f"{name} kept no figures"
        assert f"#### {section['title']}" in scoreboard
        for row in section["rows"]:
            assert row["measure"].replace("|", "\\|") in scoreboard  # escaped in tables
    for picture in PICTURES:
        data = (out / picture).read_bytes()
        assert data.startswith(PNG_MAGIC), picture
        assert len(data) > 10_000, picture
        assert f"]({picture})" in scoreboard

    # what each promise is judged by is there, as a figure and a verdict
    filter_ = json.loads((out / "filter.json").read_text())["data"]
    assert {"cat", "mapper-state", "meltano-map-transform"} <= set(filter_["slope"]["contenders"])
    assert set(filter_["every_state"]["runs"]) == {"5", "0"}
    pipeline = json.loads((out / "pipeline.json").read_text())["data"]
    assert len(pipeline["contenders"]) == 4
    fleet = json.loads((out / "fleet.json").read_text())["data"]
    assert fleet["pipelines_with_exactly_one_run"] == fleet["pipelines"]
    assert fleet["refused"] == fleet["pipelines"] * (fleet["replicas"] - 1)
    operator = json.loads((out / "operator.json").read_text())["data"]
    commands = {r["command"] for r in operator["results"]}
    assert {"mapper-state state export", "meltano state list", "meltano state get"} <= commands
