#!/usr/bin/env bash
# The mapper-state demo: an incremental Singer pipeline run twice on the embedded
# default store (.mapper-state/ in the working directory).
#
#   tap-sample --state state.fifo | mapper-state --state-id demo --state-file state.fifo | target-jsonl
#
# Run 1 delivers every row of a fresh data set; new rows are then appended, and run 2
# delivers only those, because mapper-state handed the tap the state stored by run 1.
#
# Needs: the project venv with tap-sample (uv pip install -e examples/tap-sample) and
# target-jsonl from scripts/install-tools.sh. Override the executables with MAPPER_STATE,
# TAP_SAMPLE and TARGET_JSONL, the working directory with DEMO_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAPPER_STATE="${MAPPER_STATE:-$ROOT/.venv/bin/mapper-state}"
TAP_SAMPLE="${TAP_SAMPLE:-$ROOT/.venv/bin/tap-sample}"
TARGET_JSONL="${TARGET_JSONL:-$ROOT/.tools/target-jsonl/bin/target-jsonl}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
DEMO_DIR="${DEMO_DIR:-$ROOT/examples/data/demo}"
ROWS_FIRST="${ROWS_FIRST:-100}"
ROWS_SECOND="${ROWS_SECOND:-25}"

need() { # need PATH HINT
  if [[ ! -x "$1" ]]; then
    echo "demo: $1 not found: $2" >&2
    exit 1
  fi
}
need "$PYTHON" "create the project venv (make setup)"
need "$MAPPER_STATE" "install the project: uv pip install --python .venv/bin/python -e ."
need "$TAP_SAMPLE" "uv pip install --python .venv/bin/python -e examples/tap-sample"
need "$TARGET_JSONL" "run scripts/install-tools.sh"

# A fresh working directory: the store (.mapper-state/), the data and the output live there.
# It lies inside the repository, whose meltano.yml mapper-state would otherwise take the
# store from (a Meltano project's own): name the embedded default instead.
export MAPPER_STATE_STATE_BACKEND__URI="file://.mapper-state"
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
cd "$DEMO_DIR"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/mapper-state-demo.XXXXXX")"
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

DATA="$DEMO_DIR/events.jsonl"
OUT="$DEMO_DIR/output"
printf '{"data_path": "%s"}\n' "$DATA" >"$TMP/tap.json"
printf '{"destination_path": "%s", "do_timestamp_file": false}\n' "$OUT" >"$TMP/target.json"

delivered() { # rows in the target's output file
  if [[ -f "$OUT/events.jsonl" ]]; then wc -l <"$OUT/events.jsonl" | tr -d ' '; else echo 0; fi
}

run_pipeline() { # run_pipeline N
  local n="$1" before after fifo="$TMP/state.fifo"
  rm -f "$fifo"
  mkfifo "$fifo"
  before="$(delivered)"
  echo "== run $n: tap-sample --state state.fifo | mapper-state --state-id demo --state-file state.fifo | target-jsonl"
  "$TAP_SAMPLE" --config "$TMP/tap.json" --state "$fifo" 2>"$TMP/tap.log" \
    | "$MAPPER_STATE" --state-id demo --state-file "$fifo" 2>"$TMP/mapper.log" \
    | "$TARGET_JSONL" --config "$TMP/target.json" >"$TMP/target.out" 2>"$TMP/target.log" \
    || {
      status=$?
      echo "demo: run $n failed (exit $status); logs:" >&2
      for log in tap mapper target; do
        echo "--- $log" >&2
        tail -n 20 "$TMP/$log.log" >&2
      done
      exit "$status"
    }
  after="$(delivered)"
  echo "   delivered $((after - before)) records (output/events.jsonl now holds $after)"
  if [[ -s "$TMP/target.out" ]]; then
    echo "   target confirmed state: $(tail -n 1 "$TMP/target.out")"
  fi
  echo "   stored state (.mapper-state/demo/state.json):"
  sed 's/^/     /' .mapper-state/demo/state.json
  echo
}

echo "== working directory: $DEMO_DIR"
"$PYTHON" "$ROOT/examples/generate_data.py" --file "$DATA" --rows "$ROWS_FIRST" | sed 's/^/   /'
run_pipeline 1

"$PYTHON" "$ROOT/examples/generate_data.py" --file "$DATA" --rows "$ROWS_SECOND" | sed 's/^/   /'
run_pipeline 2

echo "== mapper-state state get demo"
"$MAPPER_STATE" state get demo | sed 's/^/   /'
