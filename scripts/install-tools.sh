#!/usr/bin/env bash
# Install the real Singer tools used by the end-to-end tests, the demo and the benchmarks, and
# mitmproxy (the fault-injecting, request-counting proxy of tests/proxy), each in its
# own virtualenv under .tools/ (their pins clash with the project's). Idempotent: a
# second run only checks stamp files and returns at once. Run from the repository root.
#
#   scripts/install-tools.sh            install what is missing
#   scripts/install-tools.sh --force    reinstall everything
#
# Environment: PYTHON (interpreter for the venvs, default python3),
#              TOOLS_DIR (default .tools).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS_DIR="${TOOLS_DIR:-.tools}"
PYTHON="${PYTHON:-python3}"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

# name | pip requirements | executable | check argument
# Versions verified together: meltano 4.4.1 on Python 3.11; both SDK-based plugins on
# singer-sdk 0.54.9 (the project's own version); mitmproxy 11.0.2 is the newest release
# that installs on Python 3.11 (later ones need 3.12).
TOOLS=(
  "meltano|meltano[s3]==4.4.1|meltano|--version"
  "tap-postgres|meltanolabs-tap-postgres==0.10.0 singer-sdk==0.54.9|tap-postgres|--about"
  "target-jsonl|target-jsonl==0.1.4|target-jsonl|--help"
  "target-csv|meltanolabs-target-csv==0.5.0 singer-sdk==0.54.9|target-csv|--about"
  "meltano-map-transform|meltano-map-transform==0.12.3|meltano-map-transform|--about"
  "mitmproxy|mitmproxy==11.0.2|mitmdump|--version"
)

command -v "$PYTHON" >/dev/null 2>&1 || { echo "install-tools: $PYTHON not found" >&2; exit 1; }
PY_VERSION="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
stamp_of() { # the content a finished install leaves in .tools/<name>/.installed
  printf '%s\n' "$1" "$PY_VERSION"
}

# Fast path: every stamp matches and every executable is there.
if [[ $FORCE == 0 ]]; then
  all_done=1
  for spec in "${TOOLS[@]}"; do
    IFS='|' read -r name reqs exe _ <<<"$spec"
    stamp="$TOOLS_DIR/$name/.installed"
    if [[ ! -x "$TOOLS_DIR/$name/bin/$exe" || ! -f "$stamp" || "$(<"$stamp")" != "$(stamp_of "$reqs")" ]]; then
      all_done=0
      break
    fi
  done
  [[ $all_done == 1 ]] && exit 0
fi

mkdir -p "$TOOLS_DIR"

# One installer at a time (parallel test workers may call this script).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$TOOLS_DIR/.lock"
  flock 9
fi

# Compile each tool's bytecode at install: with PYTHONDONTWRITEBYTECODE set, a tool that
# was not compiled compiles itself on every start (three seconds of CPU for Meltano).
export UV_COMPILE_BYTECODE=1

# Pick the installer: uv if on PATH, else a private uv installed with pip, else pip.
UV=""
if command -v uv >/dev/null 2>&1 && uv --version >/dev/null 2>&1; then
  UV="$(command -v uv)"
elif [[ -x "$TOOLS_DIR/_uv/bin/uv" ]]; then
  UV="$TOOLS_DIR/_uv/bin/uv"
elif "$PYTHON" -m venv "$TOOLS_DIR/_uv" >/dev/null 2>&1 \
  && "$TOOLS_DIR/_uv/bin/python" -m pip install --quiet --disable-pip-version-check uv \
    >"$TOOLS_DIR/_uv.log" 2>&1; then
  UV="$TOOLS_DIR/_uv/bin/uv"
else
  rm -rf "$TOOLS_DIR/_uv"
fi
export UV_PYTHON_DOWNLOADS=never  # never fetch interpreters: use the machine's python

fail() {
  echo "install-tools: $1" >&2
  [[ -n "${2:-}" && -f "$2" ]] && tail -n 40 "$2" >&2
  exit 1
}

install_one() {
  local name="$1" reqs="$2" exe="$3" check="$4"
  local dir="$TOOLS_DIR/$name" log="$TOOLS_DIR/$name.log" stamp
  stamp="$(stamp_of "$reqs")"
  if [[ $FORCE == 0 && -x "$dir/bin/$exe" && -f "$dir/.installed" \
        && "$(cat "$dir/.installed")" == "$stamp" ]]; then
    return 0
  fi
  rm -rf "$dir"
  # shellcheck disable=SC2086  # $reqs is a list of requirements
  if [[ -n "$UV" ]]; then
    { "$UV" venv --quiet --python "$(command -v "$PYTHON")" "$dir" \
      && "$UV" pip install --quiet --python "$dir/bin/python" $reqs; } >"$log" 2>&1 \
      || fail "installing $name ($reqs) failed; log: $log" "$log"
  else
    { "$PYTHON" -m venv "$dir" \
      && "$dir/bin/python" -m pip install --quiet --disable-pip-version-check $reqs; } >"$log" 2>&1 \
      || fail "installing $name ($reqs) failed; log: $log" "$log"
  fi
  "$dir/bin/$exe" "$check" </dev/null >"$log.check" 2>&1 \
    || fail "$dir/bin/$exe $check does not run after install" "$log.check"
  rm -f "$log" "$log.check"
  printf '%s\n' "$stamp" >"$dir/.installed"
}

pids=()
for spec in "${TOOLS[@]}"; do
  IFS='|' read -r name reqs exe check <<<"$spec"
  install_one "$name" "$reqs" "$exe" "$check" &
  pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit $status
