# mapper-state as a container entrypoint: the whole tap-to-target job, state in a bucket.
#
#   docker build -t my-elt --build-arg EXTRAS=s3 \
#     --build-arg PLUGINS="meltanolabs-tap-postgres target-jsonl" .
#   docker run -e MAPPER_STATE_STATE_ID=prod:pg-to-jsonl \
#     -e MAPPER_STATE_STATE_BACKEND__URI=s3://my-bucket/states \
#     -e MAPPER_STATE_TAP="tap-postgres --config /config/tap.json --catalog /config/catalog.json" \
#     -e MAPPER_STATE_TARGET="target-jsonl --config /config/target.json" my-elt
#
# Taps and targets get their own virtual environments (their pins often clash).
FROM python:3.11-slim

ARG EXTRAS=all
ARG PLUGINS=""

RUN useradd --create-home --uid 10001 elt
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mapper_state ./mapper_state
RUN pip install --no-cache-dir ".[${EXTRAS}]" \
 && for plugin in ${PLUGINS}; do \
      python -m venv "/opt/plugins/${plugin}" \
      && "/opt/plugins/${plugin}/bin/pip" install --no-cache-dir "${plugin}" \
      && find "/opt/plugins/${plugin}/bin" -maxdepth 1 -name 'tap-*' -o -maxdepth 1 -name 'target-*' \
         | xargs -r -I{} ln -s {} /usr/local/bin/ ; \
    done

USER elt
ENV MAPPER_STATE_LOG_FORMAT=json
# Exit codes: 0 ok, 2 config, 3 lease busy, 4 lease lost, 5 store, 7 tap, 8 target, 143 SIGTERM.
ENTRYPOINT ["mapper-state", "run"]
