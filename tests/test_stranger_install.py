"""The plain wheel, installed as a stranger installs it: small, and `--about` still complete."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.dist import Dist, install_in_venv, outside_checkout


def test_the_plain_install_has_no_singer_sdk_and_about_still_works(built_dist: Dist) -> None:
    venv = outside_checkout() / "venv"
    try:
        install_in_venv(venv, str(built_dist.wheel))
        python = str(venv / "bin" / "python")
        for module in ("singer_sdk", "sqlalchemy"):
            probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
            assert probe.returncode != 0, f"{module} is installed with the plain wheel"

        def about(fmt: str) -> str:
            result = subprocess.run(
                [str(venv / "bin" / "mapper-state"), "--about", "--format", fmt],
                capture_output=True,
                text=True,
                cwd=venv.parent,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            return result.stdout

        doc = json.loads(about("json"))
        assert doc["name"] == "mapper-state"
        assert doc["capabilities"] == ["about"]
        uri = doc["settings"]["properties"]["state_backend"]["properties"]["uri"]
        assert uri["default"] == "file://.mapper-state"
        markdown = about("markdown")
        assert markdown.startswith("# `mapper-state`\n")
        assert "| Setting | Required | Default | Description |" in markdown
        assert "| state_backend.uri | False | file://.mapper-state |" in markdown
    finally:
        shutil.rmtree(venv.parent, ignore_errors=True)


def test_the_install_doc_publishes_each_extras_size() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "install.md").read_text()
    for extra in ("(none)", "`[s3]`", "`[azure]`", "`[gcs]`", "`[postgres]`", "`[all]`"):
        assert f"| {extra} |" in doc, extra
    assert "whl[s3]" in doc
    assert "Meltano splits `pip_url` on spaces" in doc
