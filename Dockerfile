# mapper-state as a container entrypoint: the whole tap-to-target job, state in a bucket.
#
# The image is built from the wheel, as `pip install` gives it to anyone (nothing of the
# source tree is copied; .dockerignore sends only the wheel):
#
#   uv build                           # or: python -m build; makes dist/mapper_state-<version>-py3-none-any.whl
#   docker build -t my-elt --build-arg EXTRAS=s3 \
#     --build-arg PLUGINS="meltanolabs-tap-postgres target-jsonl" .
#   docker run -e MAPPER_STATE_STATE_ID=prod:pg-to-jsonl \
#     -e MAPPER_STATE_STATE_BACKEND__URI=s3://my-bucket/states \
#     -e MAPPER_STATE_TAP="tap-postgres --config /config/tap.json --catalog /config/catalog.json" \
#     -e MAPPER_STATE_TARGET="target-jsonl --config /config/target.json" my-elt
#
# EXTRAS: s3, azure, gcs, postgres, all (the default) or empty for the local store only.
# Taps and targets get their own virtual environments (their pins often clash).
# Base and size: docs/container.md.
FROM python:3.11-slim

ARG EXTRAS=all
ARG PLUGINS=""

COPY dist/mapper_state-*.whl /tmp/dist/
RUN set -eu; \
    set -- /tmp/dist/mapper_state-*.whl; \
    if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then \
      echo "dist/ must hold exactly one mapper-state wheel (run uv build), not: $*" >&2; exit 1; \
    fi; \
    wheel="$1"; \
    if [ -n "${EXTRAS}" ]; then wheel="${wheel}[${EXTRAS}]"; fi; \
    pip install --no-cache-dir "${wheel}"; \
    rm -rf /tmp/dist; \
    for plugin in ${PLUGINS}; do \
      python -m venv "/opt/plugins/${plugin}"; \
      "/opt/plugins/${plugin}/bin/pip" install --no-cache-dir "${plugin}"; \
      find "/opt/plugins/${plugin}/bin" -maxdepth 1 \( -name 'tap-*' -o -name 'target-*' \) \
        -exec ln -s {} /usr/local/bin/ \; ; \
    done; \
    useradd --create-home --uid 10001 elt

USER elt
WORKDIR /home/elt
ENV MAPPER_STATE_LOG_FORMAT=json
# Exit codes (docs/exit-codes.md): 0 ok, 2 config, 3 lease busy, 4 lease lost, 5 store,
# 7 tap, 8 target, 143 SIGTERM.
ENTRYPOINT ["mapper-state", "run"]
