# syntax=docker/dockerfile:1
# Two stages: the builder makes wheels (every dependency, then ours), the runtime installs them with
# no compiler, no pip cache and no source tree. Build and push (manifests/README.md, "The image"):
#   docker build -t registry.example.com/hopsworks/scheduling-webhook:0.1.0 .
# Pin the base by digest in a release pipeline; the tag is kept here for readability.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, from the exact versions `make` also installs: this layer is rebuilt only
# when constraints.txt changes, never for a code change.
COPY constraints.txt ./
RUN pip wheel --wheel-dir /deps -r constraints.txt
# Then the project itself, without dependencies (they are all in /deps).
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN pip wheel --no-deps --wheel-dir /app .

FROM ${PYTHON_IMAGE} AS runtime
# The release's version (`make image` passes pyproject's); labels as the OCI image spec names them.
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="scheduling-webhook" \
      org.opencontainers.image.description="Kubernetes admission webhook: scheduling, Run:ai binding and GPU quota for a data-science platform" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The same fixed UID/GID as runAsUser/runAsGroup in the chart's Deployment (manifests/chart).
RUN groupadd --system --gid 10001 webhook \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin webhook
# Bind-mount the wheels instead of copying them, so they never become a layer of the image. The
# mounts are cached by content: /deps is unchanged by a code change, so this layer is reused.
RUN --mount=type=bind,from=builder,source=/deps,target=/deps \
    --mount=type=bind,from=builder,source=/src/constraints.txt,target=/constraints.txt \
    pip install --no-index --find-links=/deps -r /constraints.txt
RUN --mount=type=bind,from=builder,source=/app,target=/app \
    --mount=type=bind,from=builder,source=/src/constraints.txt,target=/constraints.txt \
    pip install --no-index --find-links=/app -c /constraints.txt scheduling-webhook
# Numeric, so the kubelet can verify runAsNonRoot without looking the name up.
USER 10001:10001
# The chart's ports: admission 9443, the console and the APIs 8443, probes and /metrics 8444, the
# aggregated API (behind the apiserver) 8445.
EXPOSE 8443 8444 8445 9443
ENTRYPOINT ["scheduling-webhook"]
# Certificates and the Run:ai client secret are mounted at run time; nothing secret is in the image.
CMD ["serve", "--certs", "/certs", "--port", "8443"]
