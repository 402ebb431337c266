"""The guard against lost bookmarks, at every commit of the filter, `--after-target` and
`run`, through the real command on the local store and on S3 (moto)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from mapper_state.core import bookmarks
from tests.conftest import ON_BOTH
from tests.helpers import StoreCli, refreshing, state_line, tiny_run

PRIOR = {"bookmarks": {"users": {"replication_key_value": "2024-05-01"}, "orders": {"id": 9}}}
REFUSED = "not committing a state without bookmarks over the state of job"


def run_pipeline(
    cli: StoreCli, tmp_path: Path, *extra: str, **env: str
) -> subprocess.CompletedProcess[bytes]:
    run: Callable[..., subprocess.CompletedProcess[bytes]] = cli  # ``**env`` holds only settings
    return run(*tiny_run(tmp_path, *extra), **env)


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
@pytest.mark.parametrize("empty", [{}, {"bookmarks": {}}, None])
def test_an_empty_state_never_replaces_bookmarks(store_cli: StoreCli, empty: object) -> None:
    cli = store_cli
    cli.set("job", PRIOR)
    result = cli("--state-id", "job", input=state_line(empty))
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert REFUSED in err
    assert "which has bookmarks for orders, users" in err
    assert "--full-refresh" in err
    assert "allow_state_reset" in err  # how to allow it
    assert "commits=0" in err
    assert cli.get("job") == PRIOR
    history = cli("state", "history", "job", "--format", "json")
    assert len(json.loads(history.stdout)) == 1  # nothing was written, nor kept


def test_after_the_target_too(store_cli: StoreCli) -> None:
    cli = store_cli
    cli.set("job", PRIOR)
    result = cli("--state-id", "job", "--after-target", input=b"{}\n")
    assert result.returncode == 0, result.stderr
    assert REFUSED in result.stderr.decode()
    assert result.stdout == b"{}\n"  # still passed through
    assert cli.get("job") == PRIOR


@pytest.mark.parametrize(
    ("extra", "env"),
    [
        (("--full-refresh",), {}),
        (("--set", "allow_state_reset=true"), {}),
        ((), {"MAPPER_STATE_ALLOW_STATE_RESET": "true"}),
        (tuple(refreshing("users", "orders")), {}),
    ],
)
def test_a_reset_that_was_asked_for_is_written(
    store_cli: StoreCli, extra: tuple[str, ...], env: dict[str, str]
) -> None:
    cli = store_cli
    cli.set("job", PRIOR)
    result = cli("--state-id", "job", *extra, input=state_line({}), **env)
    assert result.returncode == 0, result.stderr
    assert REFUSED not in result.stderr.decode()
    assert cli.get("job") == {}


def test_dropped_streams_are_kept_unless_refreshed(store_cli: StoreCli) -> None:
    cli = store_cli
    cli.set("job", PRIOR)
    users = {"replication_key_value": "2024-06-01"}
    kept = cli("--state-id", "job", input=state_line({"bookmarks": {"users": users}}))
    assert kept.returncode == 0, kept.stderr
    assert (
        "the new state of job has no bookmark for orders, which the stored state has: kept it"
        in kept.stderr.decode()
    )
    assert cli.get("job") == {"bookmarks": {"users": users, "orders": {"id": 9}}}

    refreshed = cli(
        "--state-id",
        "job",
        *refreshing("orders"),
        input=state_line({"bookmarks": {"users": users}}),
    )
    assert refreshed.returncode == 0, refreshed.stderr
    assert "kept" not in refreshed.stderr.decode()
    assert cli.get("job") == {"bookmarks": {"users": users}}


def test_a_refreshed_stream_is_protected_once_this_run_stored_its_bookmark(
    store_cli: StoreCli,
) -> None:
    """An empty state emitted on drain after a full refresh of one stream does not throw away
    what the run extracted: the refreshed stream's new bookmark is kept too."""
    cli = store_cli
    cli.set("job", PRIOR)
    fresh = {"bookmarks": {"users": PRIOR["bookmarks"]["users"], "orders": {"id": 2}}}
    stream = state_line(fresh) + state_line({})
    result = cli(
        "--state-id",
        "job",
        *refreshing("orders"),
        "--checkpoint-interval-seconds",
        "0",
        input=stream,
    )
    assert result.returncode == 0, result.stderr
    assert REFUSED in result.stderr.decode()
    assert cli.get("job") == fresh


@pytest.mark.parametrize("store_cli", ON_BOTH, indirect=True)
def test_run_does_not_store_the_empty_state_a_target_prints_on_drain(
    store_cli: StoreCli, tmp_path: Path
) -> None:
    cli = store_cli
    first = run_pipeline(cli, tmp_path)
    assert first.returncode == 0, first.stderr
    assert cli.get("job") == {"bookmarks": {"s": 3}}
    second = run_pipeline(cli, tmp_path, TINY_TARGET_EMPTY_STATE_AT_END="1")
    assert second.returncode == 0, second.stderr
    assert REFUSED in second.stderr.decode()
    assert cli.get("job") == {"bookmarks": {"s": 6}}  # the last state with bookmarks


def test_holds_bookmarks() -> None:
    assert not bookmarks.holds_bookmarks(None)
    assert not bookmarks.holds_bookmarks({})
    assert not bookmarks.holds_bookmarks({"bookmarks": {}, "currently_syncing": "x"})
    assert not bookmarks.holds_bookmarks({"currently_syncing": None})
    assert bookmarks.holds_bookmarks({"bookmarks": {"s": 1}})
    assert bookmarks.holds_bookmarks({"users": "2024-01-01"})  # a tap's own shape
    assert bookmarks.parse_stream_list('["a,b", "c"]') == {"a,b", "c"}
    assert bookmarks.parse_stream_list("a, b,") == {"a", "b"}
