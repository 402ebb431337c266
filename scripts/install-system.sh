#!/usr/bin/env bash
# The system packages the test suite needs: the PostgreSQL 15 server binaries (the
# end-to-end tests start a throw-away cluster), Node.js with npm (Azurite) and Ceph's
# monitor, OSD and RADOS Gateway (the tests start a one-node cluster as a second S3); where
# no Docker engine works, Podman with runc and mmdebstrap (tests/test_container.py builds the
# image on a base made from Debian's packages: scripts/container.sh); Prometheus with
# promtool (the fleet alert rules are checked by promtool and fired by a real server).
# Installs with apt-get only what is missing, and only when it can (root, apt-get);
# otherwise it says what to install and lets the tests fail with their own message.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 \
  || missing+=(postgresql)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
for binary in radosgw ceph-mon ceph-osd ceph; do
  command -v "$binary" >/dev/null 2>&1 || { missing+=(radosgw ceph-mon ceph-osd ceph-common); break; }
done
# the container engine: Podman and runc (crun refuses hybrid cgroups), without Podman's
# recommended extras; mmdebstrap makes the base image where no registry is reachable
containers=()
if ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
  command -v podman >/dev/null 2>&1 || containers+=(podman)
  command -v runc >/dev/null 2>&1 || containers+=(runc)
  command -v mmdebstrap >/dev/null 2>&1 || containers+=(mmdebstrap)
fi
# the Prometheus server and promtool, without the exporters Debian recommends
for binary in prometheus promtool; do
  command -v "$binary" >/dev/null 2>&1 || { containers+=(prometheus); break; }
done
[[ ${#missing[@]} -eq 0 && ${#containers[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "install-system: installing ${missing[*]} ${containers[*]}" >&2
  apt-get update -qq >/dev/null
  if [[ ${#missing[@]} -gt 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [[ ${#containers[@]} -gt 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${containers[@]}" >/dev/null
  fi
else
  echo "install-system: please install: ${missing[*]} ${containers[*]}" >&2
fi
