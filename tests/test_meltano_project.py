"""In a Meltano project, ``mapper-state`` opens the store of its ``meltano.yml``.

An operator who inspects states from a project's directory means the states Meltano
uses. The precedence: flags > ``--config`` > ``MAPPER_STATE_*`` > ``MELTANO_STATE_BACKEND_URI``
> the ``meltano.yml`` of the project (``MELTANO_PROJECT_ROOT``, else the working directory
upward) > ``file://.mapper-state``. Real Meltano writing such a state: tests/e2e/test_meltano_uri.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dist import Installed
from tests.servers import StoreLocation
from tests.support.cli import invoke
from tests.support.processes import clean_env

ID = "dev:tap-a-to-target-b"


def project(root: Path, backend: dict[str, Any] | None) -> Path:
    """A Meltano project at ``root`` with ``backend`` as its ``state_backend``; its ``sub``."""
    root.mkdir(exist_ok=True)
    doc: dict[str, Any] = {"default_environment": "dev", "environments": [{"name": "dev"}]}
    if backend is not None:
        doc["state_backend"] = backend
    (root / "meltano.yml").write_text(yaml.safe_dump(doc))
    (root / "sub" / "deeper").mkdir(parents=True)
    return root / "sub" / "deeper"


def put(uri: str, value: object, state_id: str = ID, **env: str) -> None:
    result = invoke(
        "state",
        "set",
        state_id,
        json.dumps(value),
        "--state-backend-uri",
        uri,
        env=clean_env(**env),
    )
    assert result.returncode == 0, result.stderr


def get(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """``mapper-state state get`` run in ``cwd``, which must succeed."""
    result = invoke("state", "get", ID, *args, cwd=cwd, env=clean_env(**env))
    assert result.returncode == 0, result.stderr
    return result


def test_the_project_store_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    sub = project(tmp_path, {"uri": "file://${MELTANO_PROJECT_ROOT}/.meltano/state"})
    put(f"file://{tmp_path}/.meltano/state", {"n": 1})
    result = get(sub)
    assert json.loads(result.stdout) == {"n": 1}
    # which store, and from where, is said on stderr
    assert f"store file://{tmp_path}/.meltano/state" in result.stderr.decode()
    assert str(tmp_path / "meltano.yml") in result.stderr.decode()
    listed = invoke("state", "list", cwd=sub, env=clean_env())
    assert listed.stdout.decode().split() == [ID]


def test_the_add_on_uri_is_its_store_and_a_relative_path_is_the_projects(tmp_path: Path) -> None:
    sub = project(tmp_path, {"uri": "mapper-state+file://states"})
    put(f"file://{tmp_path}/states", {"n": 2})
    result = get(sub)
    assert json.loads(result.stdout) == {"n": 2}
    assert not (sub / "states").exists()


def test_meltano_project_root_names_the_project_from_anywhere(tmp_path: Path) -> None:
    project(tmp_path / "p", {"uri": "mapper-state+file://states"})
    put(f"file://{tmp_path}/p/states", {"n": 3})
    result = get(tmp_path, MELTANO_PROJECT_ROOT=str(tmp_path / "p"))
    assert json.loads(result.stdout) == {"n": 3}


def test_the_add_on_store_settings_are_read_on_s3(
    tmp_path: Path, s3_location: StoreLocation
) -> None:
    options = s3_location.options
    credentials = {
        "AWS_ACCESS_KEY_ID": options.pop("aws_access_key_id"),
        "AWS_SECRET_ACCESS_KEY": options.pop("aws_secret_access_key"),
    }
    sub = project(
        tmp_path,
        {"uri": "mapper-state+" + s3_location.uri, "mapper-state+s3": options},
    )
    stored = invoke("state", "set", ID, '{"n": 4}', env=clean_env(**s3_location.env))
    assert stored.returncode == 0, stored.stderr
    result = get(sub, **credentials)
    assert json.loads(result.stdout) == {"n": 4}


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "yml"),
        ((), {"MELTANO_STATE_BACKEND_URI": "file://{root}/meltano-var"}, "meltano-var"),
        ((), {"MAPPER_STATE_STATE_BACKEND__URI": "file://{root}/ours"}, "ours"),
        (("--state-backend-uri", "file://{root}/flag"), {}, "flag"),
        (("--config", "{root}/c.json"), {}, "config"),
    ],
    ids=["meltano.yml", "MELTANO_STATE_BACKEND_URI", "MAPPER_STATE_*", "flag", "--config"],
)
def test_the_precedence_of_the_stores(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    sub = project(tmp_path, {"uri": f"file://{tmp_path}/yml"})
    (tmp_path / "c.json").write_text(
        json.dumps({"state_backend": {"uri": f"file://{tmp_path}/config"}})
    )
    for name in ("yml", "meltano-var", "ours", "flag", "config"):
        put(f"file://{tmp_path}/{name}", {"from": name})
    given = [a.format(root=tmp_path) for a in args]
    result = get(sub, *given, **{k: v.format(root=tmp_path) for k, v in env.items()})
    assert json.loads(result.stdout) == {"from": expected}


@pytest.mark.parametrize(
    "backend", [None, {"uri": "systemdb"}], ids=["no state_backend", "systemdb"]
)
def test_without_a_store_in_meltano_yml_the_default_stays(
    tmp_path: Path, backend: dict[str, str] | None
) -> None:
    sub = project(tmp_path, backend)
    put(f"file://{sub}/.mapper-state", {"n": 5})
    result = get(sub)
    assert json.loads(result.stdout) == {"n": 5}
    assert b"meltano.yml" not in result.stderr


def test_outside_a_project_the_default_stays(tmp_path: Path) -> None:
    put(f"file://{tmp_path}/.mapper-state", {"n": 6})
    assert json.loads(get(tmp_path).stdout) == {"n": 6}


# -- with and without PyYAML ---------------------------------------------------------------


def _wheel_cli(installed: Installed, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``mapper-state ARGS`` of the plain wheel (no PyYAML: what ``uv tool install`` gives)."""
    return subprocess.run(
        [str(installed.bin / "mapper-state"), *args],
        cwd=cwd, env=installed.env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_explicit_uri_reads_no_meltano_file(tmp_path: Path, installed_wheel: Installed) -> None:
    """``--state-backend-uri`` given: the project's ``meltano.yml`` is neither read (a broken
    one is no error) nor warned about (no PyYAML is no warning)."""
    root = tmp_path / "project"
    sub = project(root, {"uri": "mapper-state+file://states"})
    store = f"file://{tmp_path}/elsewhere"
    put(store, {"n": 4})
    probe = installed_wheel.python("import importlib.util; print(importlib.util.find_spec('yaml'))")
    assert probe == "None", "the plain wheel brings PyYAML"
    result = _wheel_cli(installed_wheel, sub, "state", "get", ID, "--state-backend-uri", store)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"n": 4}
    assert "meltano.yml" not in result.stderr, result.stderr
    assert "PyYAML" not in result.stderr, result.stderr
    (root / "meltano.yml").write_text("state_backend: [unclosed\n")
    again = invoke("state", "get", ID, "--state-backend-uri", store, cwd=sub, env=clean_env())
    assert again.returncode == 0, again.stderr
    assert b"meltano.yml" not in again.stderr, again.stderr


def test_without_pyyaml_the_projects_store_is_found(
    tmp_path: Path, installed_wheel: Installed
) -> None:
    """No PyYAML (a ``uv tool install mapper-state``): the ``state_backend`` of a
    ``meltano.yml`` as ``meltano config set`` writes it is read all the same."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "meltano.yml").write_text(
        "version: 1\ndefault_environment: dev\n"
        "state_backend:\n"
        "  uri: mapper-state+file://states  # the add-on\n"
        "  lock_timeout_seconds: 60\n"
        "  mapper-state+file:\n"
        "    history_keep: 3\n"
        "environments:\n- name: dev\n"
    )
    (root / "sub").mkdir()
    put(f"file://{root}/states", {"n": 5})
    result = _wheel_cli(installed_wheel, root / "sub", "state", "get", ID)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"n": 5}
    assert f"store file://{root}/states" in result.stderr, result.stderr
    assert "PyYAML" not in result.stderr, result.stderr
