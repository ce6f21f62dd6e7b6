# syntax=docker/dockerfile:1
#
# One image for both processes:
#   reconciler: the default ENTRYPOINT (koord-queue-reconciler)
#   webhook:    command: ["koord-queue-webhook"] (manifests/webhook.yaml)
#
# Build:  docker build -t koord-queue-py:0.2.0 .
#
# The builder installs the package (not editable) into a virtual environment; the final image gets
# only that environment on a slim Python base: no compiler, no pip, no source tree besides the
# installed packages, and a non-root user (uid/gid 65532) so runAsNonRoot can verify it.
# Both stages must use the same base image: the venv's python is a symlink to the base's interpreter.

# Pin the base by digest for a reproducible image: PYTHON_IMAGE=python:3.11-slim@sha256:<digest>
# (`docker buildx imagetools inspect python:3.11-slim` prints it); both stages use the same value.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
WORKDIR /src
COPY requirements/server.txt ./requirements/server.txt
# The servers' dependencies from the lock first (exact versions, every file checked against its
# hash; docs/development.md#locked-dependencies), as a layer of their own that survives code changes.
RUN /opt/venv/bin/pip install --require-hashes -r requirements/server.txt
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY webhook ./webhook
COPY reconciler ./reconciler
COPY certs ./certs
COPY koord_queue ./koord_queue
# Wheels exist for every dependency (aiohttp, orjson, cryptography, pyyaml, ...), so no build tools
# are needed even here. pip byte-compiles at install time: the running containers have a read-only
# root filesystem and never write .pyc files. The package is `koord_queue`, built with the locked
# setuptools (no build isolation) and installed without dependencies (they are all locked above;
# `pip check` fails if a locked version does not fit the package's requirements, the smoke import
# if the servers' extra is missing). `koord_queue/` links the top-level folders,
# which the wheel copies. Then a smoke import of the three entry points (webhook, reconciler and
# the opt-in in-cluster web dashboard, koord-queue-dashboard, docs/dashboard.md#installed-in-the-cluster);
# the kubectl plugin (a client tool) is not used here, so its console scripts go; pip goes last. The test harness (testenv/) is
# not part of the wheel.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation /src \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -c "import koord_queue.webhook.main, koord_queue.reconciler.main, koord_queue.certs, koord_queue.dashboard.cluster" \
 && rm -f /opt/venv/bin/kubectl-koord_queue /opt/venv/bin/kubectl_complete-koord_queue \
 && /opt/venv/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="koord-queue-py" \
      org.opencontainers.image.description="Koord-Queue compatible job queueing for Kubernetes: admission webhook, reconciler and web dashboard" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
# reconciler: 8081 health, 10259 metrics; webhook: 9443 HTTPS, 8080 metrics; web dashboard: 8080 page, 8081 health
EXPOSE 8081 10259 9443 8080
ENTRYPOINT ["koord-queue-reconciler"]
