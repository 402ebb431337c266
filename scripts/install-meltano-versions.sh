#!/usr/bin/env bash
# Install the Meltano releases the add-on supports, one virtualenv each under
# .tools/meltano-<minor>/ (the newest patch of each minor; the newest minor is .tools/meltano,
# installed by scripts/install-tools.sh). Idempotent: a stamp file per venv.
#
#   scripts/install-meltano-versions.sh           the default suite's: the oldest supported minor
#   scripts/install-meltano-versions.sh --all     every supported minor (make test-meltano-versions)
#
# The list is tests/e2e/meltano_versions.txt (one "minor version" a line, oldest first).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS_DIR="${TOOLS_DIR:-.tools}"
PYTHON="${PYTHON:-python3}"
ALL=0
[[ "${1:-}" == "--all" ]] && ALL=1

mapfile -t VERSIONS < <(grep -v '^#' tests/e2e/meltano_versions.txt | grep -v '^$')
newest="${VERSIONS[-1]}"
if [[ $ALL == 0 ]]; then
  VERSIONS=("${VERSIONS[0]}")
fi

PY_VERSION="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
mkdir -p "$TOOLS_DIR"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$TOOLS_DIR/.lock-meltano-versions"
  flock 9
fi
export UV_COMPILE_BYTECODE=1 UV_PYTHON_DOWNLOADS=never

status=0
for line in "${VERSIONS[@]}"; do
  read -r minor version <<<"$line"
  [[ "$line" == "$newest" ]] && continue  # .tools/meltano (scripts/install-tools.sh)
  dir="$TOOLS_DIR/meltano-$minor"
  stamp="$(printf '%s\n' "meltano[s3]==$version" "$PY_VERSION")"
  if [[ -x "$dir/bin/meltano" && -f "$dir/.installed" && "$(<"$dir/.installed")" == "$stamp" ]]; then
    continue
  fi
  rm -rf "$dir"
  log="$TOOLS_DIR/meltano-$minor.log"
  if { uv venv --quiet --python "$(command -v "$PYTHON")" "$dir" \
      && uv pip install --quiet --python "$dir/bin/python" "meltano[s3]==$version" \
      && "$dir/bin/meltano" --version </dev/null; } >"$log" 2>&1; then
    printf '%s\n' "$stamp" >"$dir/.installed"
    rm -f "$log"
  else
    echo "install-meltano-versions: meltano $version failed; log: $log" >&2
    tail -n 20 "$log" >&2
    status=1
  fi
done
exit $status
