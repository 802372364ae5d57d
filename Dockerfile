# syntax=docker/dockerfile:1
# Two stages: the builder makes wheels (ours and every dependency), the runtime installs them with
# no compiler, no pip cache and no source tree. Build: docker build -t scheduling-webhook:0.1.0 .
# Pin the base by digest in a release pipeline; the tag is kept here for readability.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook ./webhook
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SCHEDULING_WEBHOOK_MANIFESTS=/usr/share/scheduling-webhook/manifests
# The same fixed UID/GID as runAsUser/runAsGroup in manifests/06-deployment.yaml.
RUN groupadd --system --gid 10001 webhook \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin webhook
# Bind-mount the wheels instead of copying them, so they never become a layer of the image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels scheduling-webhook
# For `scheduling-webhook manifests` run from the image; read-only and owned by root.
COPY manifests /usr/share/scheduling-webhook/manifests
# Numeric, so the kubelet can verify runAsNonRoot without looking the name up.
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["scheduling-webhook"]
# Certificates and the Run:ai client secret are mounted at run time; nothing secret is in the image.
CMD ["serve", "--certs", "/certs", "--port", "8443"]
