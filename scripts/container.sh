#!/usr/bin/env bash
# The container engine of this project: Docker where it exists and works, else Podman with
# the settings of scripts/containers/ (machines without systemd, with hybrid cgroups, a
# sandbox that refuses to raise RLIMIT_NPROC: see those files), its images kept in
# .containers/ (or $CONTAINER_STATE_DIR), not in the machine's own storage.
#
#   scripts/container.sh engine        print "docker" or "podman" (exit 1 and say why: none works)
#   scripts/container.sh make-base     make the Debian base image (when no registry is reachable)
#   scripts/container.sh build [TAG]   build the image (default mapper-state:dev) from dist/'s wheel
#   scripts/container.sh ARGS...       the engine with ARGS (run, stop, rm, images, image inspect...)
#
# build: EXTRAS (default all) as the Dockerfile's build argument. Where the Dockerfile's
# default base (python:3.11-slim) cannot be pulled, the base is made from Debian's packages
# (Debian 12, its Python 3.11, tini) with mmdebstrap and `podman import`, once; with
# Podman the wheels come from a wheelhouse made on this machine (pip download), mounted into
# the build, so the build itself needs no network.
#
# CONTAINER_ENGINE=docker|podman skips the detection; CONTAINER_STORAGE_DRIVER=overlay|vfs
# skips podman's overlay probe; CONTAINER_STATE_DIR moves .containers/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE_DIR=${CONTAINER_STATE_DIR:-$ROOT/.containers}
DEFAULT_BASE=python:3.11-slim
DEBIAN_BASE=localhost/mapper-state-base:bookworm
# minbase: apt, dpkg, coreutils... plus what the image needs (python3-pip: the Dockerfile's
# `pip install`, as in python:3.11-slim; python-is-python3: its `python -m venv`)
BASE_PACKAGES=python3,python3-pip,python-is-python3,tini,ca-certificates

say() { echo "container: $*" >&2; }

engine() {
  if [[ -n ${CONTAINER_ENGINE:-} ]]; then
    echo "$CONTAINER_ENGINE"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1; then
    echo podman
  else
    say "no container engine works here: no docker with a running daemon, no podman with runc" \
      "(scripts/install-system.sh installs podman and runc)"
    return 1
  fi
}

# overlay where the kernel's overlayfs mounts in $STATE_DIR (a container starts in half a
# second), else vfs (seconds: it copies the image's layers for each container); probed once,
# the answer kept in $STATE_DIR/storage-driver (its images are in that driver's storage)
storage_driver() {
  if [[ -n ${CONTAINER_STORAGE_DRIVER:-} ]]; then
    echo "$CONTAINER_STORAGE_DRIVER"
    return
  fi
  if [[ -f $STATE_DIR/storage-driver ]]; then
    cat "$STATE_DIR/storage-driver"
    return
  fi
  local probe driver=vfs
  probe=$(mktemp -d "$STATE_DIR/overlay-probe.XXXXXX")
  mkdir -p "$probe"/{lower,upper,work,merged}
  if [[ $(id -u) -eq 0 ]] && mount -t overlay overlay \
    -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    driver=overlay
  fi
  rm -rf "$probe"
  echo "$driver" >"$probe.answer" && mv "$probe.answer" "$STATE_DIR/storage-driver"
  echo "$driver"
}

# the engine's command line, with this project's settings for podman
engine_cmd() {
  local name driver
  name=$(engine)
  if [[ $name == podman ]]; then
    mkdir -p "$STATE_DIR"
    driver=$(storage_driver)
    export CONTAINERS_CONF=$ROOT/scripts/containers/containers.conf
    export CONTAINERS_STORAGE_CONF=$ROOT/scripts/containers/storage-$driver.conf
    CMD=(podman --root "$STATE_DIR/$driver/storage" --runroot "$STATE_DIR/$driver/run"
      --tmpdir "$STATE_DIR/tmp")
  else
    CMD=(docker)
  fi
}

has_image() { "${CMD[@]}" image inspect "$1" >/dev/null 2>&1; }

make_debian_base() {
  command -v mmdebstrap >/dev/null || { say "mmdebstrap is missing (scripts/install-system.sh)"; return 1; }
  local sources tar
  # the machine's own apt sources (deb822 or one-line); mmdebstrap reads either file
  sources=$(ls /etc/apt/sources.list.d/debian.sources 2>/dev/null || echo /etc/apt/sources.list)
  tar=$STATE_DIR/base.tar
  say "making $DEBIAN_BASE from Debian's packages ($BASE_PACKAGES) with $sources"
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' \
    bookworm "$tar" "$sources"
  "${CMD[@]}" import --quiet "$tar" "$DEBIAN_BASE" >/dev/null
  rm -f "$tar"
}

# the base to build on: the Dockerfile's default where it is here or can be pulled, else
# the Debian base (made once)
choose_base() {
  if has_image "$DEFAULT_BASE" || "${CMD[@]}" pull --quiet "docker.io/library/$DEFAULT_BASE" >/dev/null 2>&1; then
    echo "$DEFAULT_BASE"
    return
  fi
  has_image "$DEBIAN_BASE" || make_debian_base >&2
  echo "$DEBIAN_BASE"
}

# the wheels of the mapper-state wheel's dependencies with EXTRAS, for Python 3.11 on this
# platform, in a directory kept while pyproject.toml and EXTRAS stay the same
wheelhouse() {
  local wheel=$1 extras=$2 key dir
  key=$( (cat "$ROOT/pyproject.toml"; echo "$extras") | sha256sum | cut -c1-16)
  dir=$STATE_DIR/wheels/$key
  if [[ ! -f $dir/.complete ]]; then
    rm -rf "$dir" && mkdir -p "$dir"
    say "downloading the wheels of mapper-state${extras:+[$extras]} into $dir"
    python3 -m pip download --quiet --disable-pip-version-check --dest "$dir" \
      --only-binary=:all: --python-version 3.11 "$wheel${extras:+[$extras]}" 2> >(grep -v "is ignored: it is neither" >&2)
    rm -f "$dir"/mapper_state-*.whl
    touch "$dir/.complete"
  fi
  echo "$dir"
}

build_image() {
  local tag=${1:-mapper-state:dev} extras=${EXTRAS-all} base wheel
  local wheels=("$ROOT"/dist/mapper_state-*.whl)
  if [[ ${#wheels[@]} -ne 1 || ! -f ${wheels[0]} ]]; then
    say "dist/ must hold exactly one mapper-state wheel (make dist)"
    return 2
  fi
  wheel=${wheels[0]}
  base=$(choose_base)
  # the same inputs give the same image: skip the build (each cached step costs a container)
  local inputs
  inputs=$( (cat "$ROOT/Dockerfile" "$wheel"; echo "$extras"; "${CMD[@]}" image inspect --format '{{.Id}}' "$base") | sha256sum | cut -c1-32)
  if [[ $("${CMD[@]}" image inspect --format '{{index .Labels "mapper-state.inputs"}}' "$tag" 2>/dev/null) == "$inputs" ]]; then
    say "$tag is up to date (same Dockerfile, wheel, EXTRAS and base)"
    return
  fi
  local args=(build --tag "$tag" --label "mapper-state.inputs=$inputs" --build-arg "BASE=$base"
    --build-arg "EXTRAS=$extras" --file "$ROOT/Dockerfile")
  if [[ ${CMD[0]} == podman ]]; then
    args+=(--network none --volume "$(wheelhouse "$wheel" "$extras"):/wheels:ro" --build-arg WHEELS=/wheels)
  fi
  say "building $tag on $base (EXTRAS=$extras) with ${CMD[0]}"
  local previous
  previous=$("${CMD[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  "${CMD[@]}" "${args[@]}" "$ROOT" >&2
  # the image the tag named before, now untagged: removed unless a container still uses it
  if [[ -n $previous && $previous != $("${CMD[@]}" image inspect --format '{{.Id}}' "$tag") ]]; then
    "${CMD[@]}" rmi "$previous" >/dev/null 2>&1 || true
  fi
}

engine_cmd_or_exit() { engine_cmd || exit 1; }

case ${1:-} in
  engine) engine ;;
  make-base) engine_cmd_or_exit; has_image "$DEBIAN_BASE" || make_debian_base ;;
  build) engine_cmd_or_exit; build_image "${2:-}" ;;
  "") sed -n '2,16p' "$0" >&2; exit 2 ;;
  *) engine_cmd_or_exit; exec "${CMD[@]}" "$@" ;;
esac
