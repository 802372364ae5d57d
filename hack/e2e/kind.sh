#!/usr/bin/env bash
# make e2e-kind: a kind cluster, the image built and loaded, the chart installed with helm, the e2e
# suite run against it, the cluster deleted. Needs docker (with a running engine), kind, kubectl and
# helm (HELM, default: the one `make peers` builds, else helm on PATH).
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/../.."

KIND=${KIND:-kind}
KIND_CLUSTER_NAME=${KIND_CLUSTER_NAME:-scheduling-webhook-e2e}
# kind v0.27.0's image for Kubernetes 1.32 (its release notes), pinned by digest.
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.32.2@sha256:f226345927d7e348497136874b6d207e0b32cc52154ad8323129352923a3142f}
IMAGE=${IMAGE:-scheduling-webhook:e2e}
PYTHON=${PYTHON:-.venv/bin/python}
PEERS_DIR=${PEERS_DIR:-.peers}
# The helm `make peers` builds lives under its release (hack/peers/releases: HELM_VERSION).
HELM_RELEASE=${HELM_VERSION:-$(awk '$1 == "HELM_VERSION" { print $2 }' hack/peers/releases)}
HELM=${HELM:-$( [ -x "$PEERS_DIR/helm/$HELM_RELEASE/bin/helm" ] && echo "$PEERS_DIR/helm/$HELM_RELEASE/bin/helm" || echo helm )}
ARTIFACTS=${ARTIFACTS:-$(mktemp -d)}

missing=()
command -v docker >/dev/null || missing+=("docker")
command -v "$KIND" >/dev/null || missing+=("kind")
command -v kubectl >/dev/null || missing+=("kubectl")
command -v "$HELM" >/dev/null || missing+=("helm")
if [ ${#missing[@]} -eq 0 ] && ! docker info >/dev/null 2>&1; then missing+=("a running Docker engine"); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "make e2e-kind needs ${missing[*]}: not found here (make e2e KUBECONFIG=... runs the suite on an existing install)" >&2
  exit 1
fi

make --no-print-directory venv
export KUBECONFIG="$ARTIFACTS/kubeconfig"
cleanup() { "$KIND" delete cluster --name "$KIND_CLUSTER_NAME" || true; }
trap cleanup EXIT

"$KIND" create cluster --name "$KIND_CLUSTER_NAME" --image "$KIND_NODE_IMAGE" \
  --config hack/e2e/kind-config.yaml --kubeconfig "$KUBECONFIG" --wait 120s
docker build -t "$IMAGE" .
"$KIND" load docker-image "$IMAGE" --name "$KIND_CLUSTER_NAME"

# The chart issues its own certificates (certs.mode helm); --wait returns once the replicas serve.
"$HELM" install scheduling-webhook manifests/chart --namespace hopsworks --create-namespace \
  --kubeconfig "$KUBECONFIG" --wait --timeout 180s \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never

SCHEDULING_WEBHOOK_E2E_KUBECONFIG="$KUBECONFIG" "$PYTHON" -m pytest -q -p no:cacheprovider tests/e2e
