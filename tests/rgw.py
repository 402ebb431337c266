"""Ceph's RADOS Gateway (RGW) on 127.0.0.1: a second, real S3 server for the tests.

moto implements S3 from Amazon's documentation; RGW is an S3 server that production
clusters run, with its own reading of the conditional headers the lease relies on
(measured, see tests/test_rgw_server.py): it refuses ``If-None-Match: *`` on an
existing key and a wrong ``If-Match`` on PutObject, but compares ``If-Match`` with the
ETag *without* its quotes, and ignores ``If-Match`` on DeleteObject.

:func:`start_rgw` starts a one-node Ceph cluster from the Debian packages (``ceph-mon``,
``ceph-osd``, ``radosgw``, ``ceph-common``) without any block device: one monitor, one
OSD keeping its objects in memory (memstore), and the gateway, all as the current user,
with configuration, data, logs, run directory and admin sockets inside ``workdir``.
It takes a couple of seconds. The session fixture ``rgw_server`` gives the running
gateway as an :class:`~tests.servers.Emulator`; the function fixture ``rgw_location``
gives each test a fresh bucket on it.

What the configuration works around:

- Authentication between daemons is off (``auth_*_required = none``): nothing but
  127.0.0.1 reaches the cluster, and there is no keyring to create.
- The monitor speaks only the v1 protocol (``--addv a [v1:...]``, ``ms_bind_msgr2 =
  false``): on a non-default port any other address form makes clients try msgr2 and
  hang until ``client_mount_timeout``.
- ``mon_data_avail_*`` let the monitor start on a disk that is more than 70% full.
- A client command sent just after the monitor starts can go out before the client
  has the monitor map, with a zero fsid; the monitor refuses it ("wrong fsid"). The
  OSD therefore does not register its own CRUSH location or device class on start (it
  would exit; the fixture adds it to the CRUSH map instead), and the setup commands,
  all idempotent, run again when one is refused so. A start that fails anyway is
  retried once, from scratch.
- RGW's pools are created before the gateway starts (with short Paxos intervals, so
  the seven creations take under a second); left to the gateway, its first requests
  wait seconds each.

A missing binary fails the test with the command that installs it (no skip).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tests.servers import Emulator, StoreLocation, free_port
from tests.support.processes import popen, stop
from tests.support.sdk import new_bucket

INSTALL_CEPH = "scripts/install-system.sh (apt-get install radosgw ceph-mon ceph-osd ceph-common)"
CEPH_BINARIES = ("monmaptool", "ceph-mon", "ceph-osd", "ceph", "radosgw", "radosgw-admin")
RGW_POOLS = (
    ".rgw.root",
    "default.rgw.log",
    "default.rgw.control",
    "default.rgw.meta",
    "default.rgw.buckets.index",
    "default.rgw.buckets.data",
    "default.rgw.buckets.non-ec",
)
# Fixed keys of the gateway's only user (the cluster lives for one test session).
ACCESS_KEY = "RGWTESTACCESSKEY0000"
SECRET_KEY = "rgw-test-secret-key-0000000000000000000"
REGION = "us-east-1"
RGW_USER = "mapper-state"
STARTUP_SECONDS = 30  # per attempt; a start takes 1-2 s (2.4 s at most measured, two at once)
COMMAND_SECONDS = 40  # one ceph / radosgw-admin command (client_mount_timeout is 30 s)
SETUP_TRIES = 3  # runs of the monitor commands while the monitor refuses one ("wrong fsid")
STOP_SECONDS = 5  # grace after SIGTERM before SIGKILL, per daemon
MEMSTORE_BYTES = 1 << 30  # the OSD's capacity; memory is used only for what is stored
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class RgwServer:
    """A running RADOS Gateway and the S3 credentials of its user."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str


class RgwStartError(RuntimeError):
    """The cluster did not start; the message carries the end of the daemons' logs."""


def missing_ceph_binaries() -> list[str]:
    """The Ceph programs :func:`start_rgw` needs that are not on ``PATH``."""
    return [name for name in CEPH_BINARIES if shutil.which(name) is None]


@contextlib.contextmanager
def start_rgw(workdir: Path) -> Iterator[RgwServer]:
    """Run a one-node Ceph cluster with a RADOS Gateway until the end of the block.

    Everything the cluster writes stays under ``workdir`` (keep its path short: admin
    sockets are Unix sockets, limited to 107 bytes). Raises :class:`RgwStartError` if
    the cluster does not start twice in a row; every daemon is stopped on exit.
    """
    first_failure: RgwStartError | None = None
    for attempt in (1, 2):
        cluster = _Cluster(workdir / f"attempt-{attempt}")
        try:
            server = cluster.start()
        except BaseException as error:
            cluster.stop()
            if not isinstance(error, RgwStartError):
                raise
            if first_failure is not None:
                first = str(first_failure).splitlines()[0]
                raise RgwStartError(f"{error}\n(the first attempt failed too: {first})") from error
            first_failure = error
            continue
        try:
            yield server
        finally:
            cluster.stop()
        return


class _Cluster:
    """One attempt at a cluster: its files, its ports and its daemon processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "ceph.conf"
        self.logs = root / "log"
        self.mon_port = free_port()
        self.rgw_port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.rgw_port}"
        self.fsid = str(uuid.uuid4())
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "CEPH_CONF": str(self.conf)}

    def start(self) -> RgwServer:
        """Create the cluster and start its daemons; raise :class:`RgwStartError` if not."""
        for sub in ("mon/a", "osd/0", "rgw", "run", "log"):
            (self.root / sub).mkdir(parents=True)
        self.conf.write_text(self._config())
        deadline = time.monotonic() + STARTUP_SECONDS

        monmap = str(self.root / "monmap")
        mon_addr = f"[v1:127.0.0.1:{self.mon_port}]"
        self._run(["monmaptool", "--create", "--fsid", self.fsid, "--addv", "a", mon_addr, monmap])
        self._run(["ceph-mon", "-i", "a", "--mkfs", "--monmap", monmap])
        self._spawn("mon.a", ["ceph-mon", "-f", "-i", "a"])

        osd_uuid = str(uuid.uuid4())
        commands = [f"osd new {osd_uuid} 0", "osd crush add osd.0 1.0 root=default"]
        for pool in RGW_POOLS:
            commands += [f"osd pool create {pool} 8 8", f"osd pool application enable {pool} rgw"]
        self._ceph(commands)

        self._run(["ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
        self._spawn("osd.0", ["ceph-osd", "-f", "-i", "0"])
        self._spawn("client.rgw.a", ["radosgw", "-f", "-n", "client.rgw.a"])
        self._wait_http(deadline)
        user = ["--uid", RGW_USER, "--display-name", RGW_USER]
        keys = ["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]
        self._run(["radosgw-admin", "user", "create", *user, *keys])
        return RgwServer(self.endpoint_url, ACCESS_KEY, SECRET_KEY, REGION)

    def stop(self) -> None:
        """Stop the daemons in reverse order of start, each with its process group.

        In this order each stops in well under a second; signalled together, the
        gateway and the OSD wait for the cluster that is going away.
        """
        for proc in reversed(list(self.daemons.values())):
            if proc.poll() is None:  # (else its group id may belong to another process by now)
                stop(proc, grace=STOP_SECONDS, group=True)
        self.daemons.clear()

    def _config(self) -> str:
        root, logs, run = self.root, self.logs, self.root / "run"
        return f"""\
[global]
fsid = {self.fsid}
mon_host = [v1:127.0.0.1:{self.mon_port}]
public_addr = 127.0.0.1
ms_bind_msgr2 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
keyring = /dev/null
client_mount_timeout = 30
run_dir = {run}
admin_socket = {run}/$name.$pid.asok
pid_file = {run}/$name.pid
log_file = {logs}/$name.log
mon_allow_pool_size_one = true
mon_data_avail_warn = 1
mon_data_avail_crit = 0
paxos_propose_interval = 0.01
paxos_min_wait = 0.001
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_crush_update_on_start = false
osd_class_update_on_start = false

[mon.a]
mon_data = {root}/mon/a

[osd.0]
osd_data = {root}/osd/0
osd_objectstore = memstore
memstore_device_bytes = {MEMSTORE_BYTES}

[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:{self.rgw_port}
rgw_data = {root}/rgw
"""

    def _ceph(self, commands: Sequence[str]) -> None:
        """Run monitor commands in one ``ceph`` process, again if one is refused as sent.

        The commands must be idempotent: a refusal for a "wrong fsid" (EPERM, a client
        race, see the module docstring) makes the whole list run again.
        """
        for _ in range(SETUP_TRIES):
            # Read from stdin, commands run one after another; `ceph` then exits 0 even
            # if one failed, hence the check of what it printed.
            result = self._run(["ceph"], stdin="\n".join(commands) + "\n", check=False)
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
            if not any("EPERM" in error or "wrong fsid" in error for error in errors):
                break
        if result.returncode != 0 or errors:
            output = (result.stdout + result.stderr).strip()[-2000:]
            self._fail(f"ceph exited with {result.returncode}:\n{output}")

    def _run(
        self, args: Sequence[str], stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command against the cluster; fail with its output if it fails."""
        try:
            result = subprocess.run(
                [args[0], "-c", str(self.conf), *args[1:]],
                input=stdin,
                capture_output=True,
                text=True,
                cwd=self.root,
                env=self.env,
                timeout=COMMAND_SECONDS,
            )
        except subprocess.TimeoutExpired:
            self._fail(f"{' '.join(args[:3])} did not finish in {COMMAND_SECONDS} s")
        if check and result.returncode != 0:
            output = (result.stdout + result.stderr).strip()[-2000:]
            self._fail(f"{' '.join(args[:3])} exited with {result.returncode}:\n{output}")
        return result

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        """Start a daemon in the foreground of its own process group."""
        with open(self.logs / f"{name}.out", "wb") as out:
            self.daemons[name] = popen(
                [args[0], "-c", str(self.conf), *args[1:]],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=self.env,
                start_new_session=True,
            )

    def _wait_http(self, deadline: float) -> None:
        """Wait until the gateway answers HTTP, while every daemon is still running."""
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    self._fail(f"{name} exited with {proc.returncode} during start")
            try:
                with _NO_PROXY.open(self.endpoint_url, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError:  # not listening yet, or timed out
                time.sleep(0.05)
        self._fail(f"radosgw did not answer on {self.endpoint_url} in {STARTUP_SECONDS} s")

    def _fail(self, message: str) -> NoReturn:
        tails = []
        for log in sorted(self.logs.glob("*")):
            text = log.read_text(errors="replace").strip()
            if text:
                tails.append(f"--- {log.name} (end) ---\n{text[-1500:]}")
        raise RgwStartError("\n".join([f"Ceph RGW did not start: {message}", *tails]))


# -- fixtures ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def rgw_server() -> Iterator[Emulator]:
    """A RADOS Gateway on a throw-away one-node Ceph cluster (see the module docstring)."""
    missing = missing_ceph_binaries()
    if missing:
        pytest.fail(
            f"Ceph is not installed (no {', '.join(missing)}): run {INSTALL_CEPH}", pytrace=False
        )
    with (
        tempfile.TemporaryDirectory(prefix="mapper-state-rgw-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        try:
            rgw = stack.enter_context(start_rgw(Path(tmp)))
        except RgwStartError as error:
            pytest.fail(str(error), pytrace=False)
        options = {
            "endpoint_url": rgw.endpoint_url,
            "aws_access_key_id": rgw.access_key,
            "aws_secret_access_key": rgw.secret_key,
            "region": rgw.region,
        }
        # Measured: DeleteObject ignores If-Match (tests/test_rgw_server.py).
        yield Emulator(
            "ceph-rgw", "s3", "s3", rgw.endpoint_url, options, ignores_delete_preconditions=True
        )


@pytest.fixture
def rgw_location(rgw_server: Emulator) -> StoreLocation:
    """A fresh bucket on the RADOS Gateway, with a prefix."""
    return StoreLocation(rgw_server, new_bucket(rgw_server.options), "pipelines/state")
