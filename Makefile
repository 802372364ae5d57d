# Two commands a newcomer needs: `make run` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# What running needs (make run, make certs): the package and its runtime dependencies only; the test
# and lint tools come with $(STAMP), on top.
RUN_STAMP := $(VENV)/.installed-run
STATE  ?= examples/cluster
HOST   ?= 127.0.0.1
PORT   ?= 8443
# The dev server's certificates; cluster certificates go to certs/cluster (manifests/README.md).
DEV_CERTS ?= certs/dev
# Where `make peers` puts the real peers the tests run (bin/, share/); share it between clones.
PEERS_DIR ?= .peers
# The Kubernetes and Helm releases the peers are built for and the tests run; empty: the defaults of
# hack/peers/releases. Each release's peers live side by side: `make test KUBE_VERSION=v1.35.4`.
export KUBE_VERSION
export HELM_VERSION

# "<major>.<minor> <supported>" of the interpreter asked for and of the one in the venv (empty when
# there is none). A venv made by another Python is recreated rather than patched: pip cannot fix it.
PY_CHECK     := import sys; v = sys.version_info; print(f"{v[0]}.{v[1]}", v >= (3, 11))
PY_INFO      := $(shell $(PYTHON) -c '$(PY_CHECK)' 2>/dev/null)
VENV_PY_INFO := $(shell $(BIN)/python -c '$(PY_CHECK)' 2>/dev/null)
VENV_STALE   := $(if $(filter $(word 1,$(PY_INFO)),$(word 1,$(VENV_PY_INFO))),,stale)

.PHONY: image run test lint typecheck bench bench-cluster bench-gopeer bench-scale-cluster bench-kueue bench-helm bench-instructions certs venv clean e2e e2e-kind peers manifests FORCE

# setuptools warns on every editable install that a folder named like the package could shadow
# it; here that folder is the package itself, so the warning says nothing to the reader.
PIP_INSTALL := PYTHONWARNINGS='ignore:Editable installation:UserWarning' $(BIN)/pip install --quiet -c constraints.txt

$(RUN_STAMP): pyproject.toml constraints.txt $(if $(VENV_STALE),FORCE)
	$(if $(PY_INFO),,$(error cannot run $(PYTHON); set PYTHON to a Python 3.11+ interpreter))
	$(if $(filter True,$(word 2,$(PY_INFO))),,$(error $(PYTHON) is Python $(word 1,$(PY_INFO)); scheduling-webhook needs 3.11+: make PYTHON=python3.11 ...))
	$(if $(and $(VENV_STALE),$(VENV_PY_INFO)),rm -rf $(VENV)  # made by Python $(word 1,$(VENV_PY_INFO)))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP)

FORCE:

venv: $(STAMP)

# Runs every time (it is quick): keeps a valid certificate for localhost and 127.0.0.1, and issues a
# new one when it is missing, expiring, from another CA or for other names.
certs: $(RUN_STAMP)
	$(BIN)/scheduling-webhook certs --out $(DEV_CERTS) --hostname localhost --ip 127.0.0.1 --keep-valid

run: certs
	$(BIN)/scheduling-webhook serve --state $(STATE) --certs $(DEV_CERTS) --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Types (mypy --strict) and the import-layer contracts (import-linter); both configured in pyproject.toml.
typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The real peers first (built once, then cached: see `peers`) and the image (rebuilt when what it
# copies changed: see `image`); without Go or root they are not built and the tests that need them
# skip naming `make peers` or `make image`, except in CI (SCHEDULING_WEBHOOK_REQUIRE_PEERS=1).
# Then the static checks (seconds): lint, types, the import-layer contracts. Then the suite;
# pytest exits 5 when it collected nothing: that must fail, never pass silently.
test: $(STAMP)
	@PEERS_DIR=$(PEERS_DIR) hack/peers/build.sh || { [ -z "$$SCHEDULING_WEBHOOK_REQUIRE_PEERS" ] && \
	  echo "peers: not built; the tests that need the real control plane will skip (make peers)"; }
	@PEERS_DIR=$(PEERS_DIR) hack/image/build.sh || { [ -z "$$SCHEDULING_WEBHOOK_REQUIRE_PEERS" ] && \
	  echo "image: not built; the tests on real nodes will skip (make image)"; }
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	PEERS_DIR=$(PEERS_DIR) $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest ran no tests"; exit 1; fi; exit $$rc

# The e2e suite (tests/e2e, also part of `make test` on the control plane of tests/support/control_plane)
# against a real cluster where the install runs: `make e2e KUBECONFIG=path`.
e2e: $(STAMP)
	@test -n "$(KUBECONFIG)" || { echo "make e2e needs KUBECONFIG=path of a cluster with the install"; exit 2; }
	SCHEDULING_WEBHOOK_E2E_KUBECONFIG=$(KUBECONFIG) $(BIN)/python -m pytest -q -p no:cacheprovider tests/e2e

# The plain YAML in manifests/ from the chart (helm template; tests/test_chart_plain.py fails when they
# drift), and docs/values.md from the chart's schema (tests/test_chart.py fails when it drifts).
manifests: $(STAMP)
	@PEERS_DIR=$(PEERS_DIR) hack/peers/build.sh helm
	$(BIN)/python -m tests.support.policy_template
	$(BIN)/python -m tests.support.webhook_conditions_template
	PEERS_DIR=$(PEERS_DIR) $(BIN)/python -m tests.support.chart
	$(BIN)/python -m tests.support.values_reference

# A kind cluster, the image built and loaded, the chart installed, the e2e suite, the cluster deleted.
e2e-kind:
	@hack/e2e/kind.sh

bench: $(STAMP) peers image bench-gopeer
	$(BIN)/python -m bench.run $(BENCH_ARGS)
	PEERS_DIR=$(PEERS_DIR) GOPEER=$(GOPEER) $(BIN)/python -m bench.real_cluster
	$(BIN)/python -m bench.connection_attacks --connections 1200 --tries 100
	$(BIN)/python -m bench.hostile_review
	$(MAKE) bench-instructions BENCH_ARGS=

# Pod creation through the real apiserver: no webhook, the minimal admission policy, the Go peer and
# the product, side by side (bench/real_cluster.py).
bench-cluster: $(STAMP) peers image bench-gopeer
	PEERS_DIR=$(PEERS_DIR) GOPEER=$(GOPEER) $(BIN)/python -m bench.real_cluster $(BENCH_ARGS)

# The Go peer of bench-cluster (bench/gopeer: controller-runtime, pinned by its go.mod and go.sum),
# built into bench/build (not committed); go rebuilds only what changed.
GOPEER := bench/build/gopeer
bench-gopeer:
	@command -v go >/dev/null || { echo "bench-gopeer needs Go (the version bench/gopeer/go.mod names)"; exit 2; }
	cd bench/gopeer && go build -trimpath -o ../build/gopeer .

# How the product's cost grows with the cluster (kwok nodes, many namespaces and pods; bench/scale_cluster.py).
# Heavy: kept out of `make test` and `make bench`.
bench-scale-cluster: $(STAMP) peers image
	PEERS_DIR=$(PEERS_DIR) $(BIN)/python -m bench.scale_cluster $(BENCH_ARGS)

# Pod creation through a `helm upgrade` that rolls the replicas, against the same loop with nothing rolling.
bench-helm: $(STAMP) peers image
	PEERS_DIR=$(PEERS_DIR) $(BIN)/python -m bench.helm_upgrade $(BENCH_ARGS)

# A Deployment choosing a unit (one Kueue pod group) against one choosing none, with the real Kueue.
bench-kueue: $(STAMP) peers image
	PEERS_DIR=$(PEERS_DIR) $(BIN)/python -m bench.kueue_colocation $(BENCH_ARGS)

# Instructions per request under valgrind: the figure that stays put on a noisy machine.
bench-instructions: $(STAMP)
	@command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install valgrind"; exit 2; }
	$(BIN)/python -m bench.instructions $(BENCH_ARGS)

# The real peers the tests run against (kube-apiserver, etcd, controllers, kubectl, kwok, ...), built
# from the Go modules pinned under hack/peers/ into $(PEERS_DIR)/bin; a second run builds nothing.
peers:
	@PEERS_DIR=$(PEERS_DIR) hack/peers/build.sh $(PEERS)

# The image from the Dockerfile, on a Python base assembled from Debian's packages, as an OCI archive in
# $(PEERS_DIR)/image (hack/image/build.sh; needs root for mmdebstrap and buildah, installed when missing).
image:
	@PEERS_DIR=$(PEERS_DIR) hack/image/build.sh

# Keeps certs/cluster: that CA is what a cluster trusts.
clean:
	rm -rf $(VENV) $(DEV_CERTS) .pytest_cache
