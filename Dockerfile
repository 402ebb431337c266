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
#   docker run -e MAPPER_STATE_STATE_ID=prod:daily \
#     -e MAPPER_STATE_STATE_BACKEND__URI=s3://my-bucket/states my-elt exec -- /jobs/load.sh
#
# EXTRAS: s3, azure, gcs, postgres, all (the default) or empty for the local store only.
# Taps and targets get their own virtual environments (their pins often clash).
# BASE: python:3.11-slim, or any Debian-like image with python, pip and python -m venv
# (`make image` makes one from Debian's packages where no registry is reachable).
# WHEELS: a directory of wheels mounted into the build (podman build --volume): pip then
# installs mapper-state's dependencies from it alone, with no index and no network.
# PID 1 is tini (Debian's; installed here if the base lacks it): it forwards signals to
# mapper-state and reaps the orphans of the tap, the target or the exec command.
# Base, size, signals and what was tested in a running container: docs/container.md.
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG EXTRAS=all
ARG PLUGINS=""
ARG WHEELS=""

COPY dist/mapper_state-*.whl /tmp/dist/
RUN set -eu; \
    set -- /tmp/dist/mapper_state-*.whl; \
    if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then \
      echo "dist/ must hold exactly one mapper-state wheel (run uv build), not: $*" >&2; exit 1; \
    fi; \
    wheel="$1"; \
    if [ -n "${EXTRAS}" ]; then wheel="${wheel}[${EXTRAS}]"; fi; \
    pip install --no-cache-dir ${WHEELS:+--no-index --find-links "${WHEELS}"} "${wheel}"; \
    rm -rf /tmp/dist; \
    if ! command -v tini >/dev/null; then \
      apt-get update; apt-get install -y --no-install-recommends tini; rm -rf /var/lib/apt/lists/*; \
    fi; \
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
# `docker run IMAGE` runs `mapper-state run` configured by the environment;
# `docker run IMAGE exec --state-id ID -- COMMAND...` holds the lease while COMMAND runs.
# Exit codes (docs/exit-codes.md): 0 ok, 2 config, 3 lease busy, 4 lease lost, 5 store,
# 7 tap, 8 target, 143 SIGTERM (docker stop).
ENTRYPOINT ["tini", "--", "mapper-state"]
CMD ["run"]
