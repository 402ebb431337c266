"""The generator of the files derived from the settings declarations (scripts/gen-reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen-reference.py"


def reference() -> ModuleType:
    """``scripts/gen-reference.py`` as a module (its name is not an importable one)."""
    spec = importlib.util.spec_from_file_location("gen_reference", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_fresh(path: Path) -> None:
    """``path`` holds exactly what the generator makes from today's declarations."""
    gen = reference()
    stale = dict(gen.stale())
    assert path not in stale, (
        f"{path.name} is stale: run .venv/bin/python scripts/gen-reference.py\n{stale[path]}"
    )
