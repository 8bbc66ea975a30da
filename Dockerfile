# syntax=docker/dockerfile:1
# tiered's OCI image: the wheel built from this tree with the locked build tools, installed
# with the locked runtime dependencies (pip --require-hashes), run as a non-root user.
#
#   docker build -t tiered:0.1.0 .
#   docker run --read-only --tmpfs /tmp -v tiered-data:/var/lib/tiered -p 4437:4437 \
#     -e TIERED_AUTH=tokens -e TIERED_ADMIN_TOKEN_FILE=/run/secrets/admin-token ... tiered:0.1.0
#
# The root file system can be read-only: tiered writes only its data dir (a volume at
# /var/lib/tiered) and, through Python's tempfile, /tmp (give it a tmpfs). Off loopback
# tiered refuses to start until TIERED_AUTH says who may use it (README, Tenants).
# Pin the base by digest in production: --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

#checkov:skip=CKV_DOCKER_7:The base is ARG PYTHON_IMAGE, a versioned tag by default (python:3.11-slim-bookworm) and meant to be pinned by digest; checkov cannot resolve the ARG and reads it as untagged.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY requirements/ requirements/
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes -r requirements/build.txt
COPY pyproject.toml README.md ./
COPY tiered/ tiered/
COPY hot/ hot/
COPY cold/ cold/
COPY gc/ gc/
COPY clients/python/tiered_client/ clients/python/tiered_client/
# Reproducible: the same tree and build lock give the same wheel (SOURCE_DATE_EPOCH).
ARG SOURCE_DATE_EPOCH=315532800
RUN SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH} /opt/build/bin/python -m build --wheel --no-isolation --outdir /dist
# The runtime: the lock first (every file hash-checked), then the wheel alone.
RUN python -m venv /opt/tiered \
 && /opt/tiered/bin/pip install --require-hashes -r requirements/runtime.txt \
 && /opt/tiered/bin/pip install --no-deps /dist/tiered-*.whl \
 && /opt/tiered/bin/pip check \
 && /opt/tiered/bin/python -m compileall -q /opt/tiered/lib

FROM ${PYTHON_IMAGE}
# A system user with a fixed uid (volume ownership, Kubernetes runAsUser) and the data dir.
RUN groupadd --system --gid 10001 tiered \
 && useradd --system --uid 10001 --gid tiered --home-dir /nonexistent --no-create-home \
    --shell /usr/sbin/nologin tiered \
 && install -d -m 0750 -o tiered -g tiered /var/lib/tiered
COPY --from=build /opt/tiered /opt/tiered
ENV PATH=/opt/tiered/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIERED_HOST=0.0.0.0 \
    TIERED_PORT=4437 \
    TIERED_DATA_DIR=/var/lib/tiered \
    TIERED_LOG_FORMAT=json
USER 10001:10001
VOLUME ["/var/lib/tiered"]
EXPOSE 4437
# Readiness: recovery finished, the journal writes, the store answers, the prefix is held.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('TIERED_PORT', '4437')}/readyz\", timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tiered"]
CMD ["serve"]
