# GreyRelease: progressive batch releases for Kubernetes.
#   make demo   releases from commits to Git (synced as Argo CD does): a good one, then a bad one rolled back by its gate and reverted, under real traffic through Traefik on the local cluster
#   make test   the whole suite: the checks and the unit tests first (the venv only), then end-to-end tests on the local cluster

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all venv lock deps system-deps binaries crds check test unit e2e demo cluster-up cluster-down clean bench compare

all: test

# Installed from the lock files only, each file checked against its sha256 there, so that an upstream
# release made since the lock cannot change what the suite runs with: requirements-test.txt (the runtime
# closure at requirements.txt's versions, and the test tools with theirs, uv among them), then the project
# itself, editable, resolving nothing. tests/test_image.py fails when a lock is stale against pyproject.toml
# or the venv differs from the lock (after a lock change, `make clean venv` drops what it no longer pins).
$(VENV)/.installed: pyproject.toml requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip check
	touch $@

venv: $(VENV)/.installed

# The benchmarks' charts: matplotlib and its closure, at the test lock's versions where the two overlap.
$(VENV)/.bench: $(VENV)/.installed requirements-bench.txt
	$(PY) -m pip install --quiet --require-hashes -r requirements-bench.txt
	touch $@

# The lock files, written by uv from pyproject.toml (settings in its [tool.uv.pip]: every platform, Python
# 3.11 on, sha256 hashes): requirements.txt the runtime dependencies, what the Dockerfile installs;
# requirements-test.txt those at the same versions and the `test` extra; requirements-bench.txt the runtime
# and the `bench` extra, at the test lock's versions. A pin already in a lock stays while pyproject.toml
# allows it: `make lock LOCK_FLAGS=--upgrade` moves every pin to the newest allowed, LOCK_FLAGS='-P ruff' one.
LOCK_FLAGS ?=
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet $(LOCK_FLAGS) pyproject.toml
lock: venv
	$(UV_COMPILE) -o requirements.txt
	$(UV_COMPILE) --extra test -c requirements.txt -o requirements-test.txt
	$(UV_COMPILE) --extra bench -c requirements-test.txt -o requirements-bench.txt

# Debian's Prometheus for the metric gates; Go builds the control plane and Traefik; iproute2's `ip` makes
# the pod network; Debian's chromium and its chromedriver open `kubectl gr dashboard` in e2e/test_dashboard.py.
# Installed only when missing.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium and chromium-driver"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; }
	@command -v go >/dev/null 2>&1 || { echo "error: Go 1.26 or newer is needed to build the local cluster" >&2; exit 1; }
	@command -v openssl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
	@command -v ip >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; }

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and traefik, built once into
# ~/.cache/greyrelease, with the Gateway API CRDs beside them; and helm, for the Helm chart charts/greyrelease
# (e2e/test_chart.py), with the ServiceMonitor CRD.
binaries: system-deps
	e2e/build/build.sh

deps: venv system-deps binaries

crds: venv
	$(PY) -m greyrelease crd -d crds

# Format (ruff format --check), lint (ruff), types (mypy --strict on the package, tests/, e2e/ and bench/)
# and layers (import-linter: each package imports only those below it, the pure ones no I/O library).
# Configured in pyproject.toml.
check: venv
	$(VENV)/bin/ruff format --check greyrelease tests e2e bench
	$(VENV)/bin/ruff check greyrelease tests e2e bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: venv
	$(PY) -m pytest tests -q

# The end-to-end files on E2E_WORKERS local clusters at once (pytest-xdist; each worker starts its own
# cluster, Prometheus and data plane, on its own ports and pod network slot, see e2e/harness/podnet.py), a
# file's tests all on one worker in order (--dist loadfile: a module's fixtures and figures stay together).
# Most of a test's time is waiting on a release's pauses, not CPU: two at once take about half the time on
# 2 cores. E2E_WORKERS=0 runs them in this process, one after another: the default when KUBECONFIG is set,
# since the tests would then share that one cluster (its cluster-wide objects: CRDs, webhook configurations).
E2E_WORKERS ?= $(if $(KUBECONFIG),0,2)
E2E = $(PY) -m pytest e2e -q -p no:cacheprovider -n $(E2E_WORKERS) --dist loadfile

e2e: deps
	$(E2E)

# The README's test command, in the order that fails soonest: the checks and the unit tests first, which
# need only the venv (about a minute), and only then the Debian packages, the local cluster's Go-built
# binaries (deps) and the end-to-end tests. pytest exits 5 when it collected no test: a failure here too.
test: check
	$(PY) -m pytest tests -q -p no:cacheprovider
	$(MAKE) --no-print-directory deps
	$(E2E) --durations=40

demo: deps
	$(PY) -m e2e.demo

# The cluster, Prometheus and the data plane (Traefik, pods that answer); prints export lines for eval.
cluster-up: deps
	$(PY) -m e2e.cluster up --with-dataplane

cluster-down: venv
	$(PY) -m e2e.cluster down

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# The controller's container image (Dockerfile), with docker or podman, whichever is installed.
IMAGE ?= greyrelease:0.1.0
CONTAINER_ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)

.PHONY: image
image:
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
	  echo "error: a container engine (docker or podman) is needed to build $(IMAGE)" >&2; exit 1; fi
	$(CONTAINER_ENGINE) build -t $(IMAGE) .

# The same Dockerfile without a container engine or a registry (root, Debian): buildah on a Debian
# bookworm base made with debootstrap, then a smoke check of the image; see image/build.sh.
.PHONY: image-local
image-local:
	IMAGE=$(IMAGE) image/build.sh

# Many releases at once on the local cluster; writes bench/RESULTS.md (+ results.json, results.png).
# `make bench SHARDS="1 3" N=3000`: N releases under one replica, then under 3 run with --shards 3
# (python -m bench.shards over 30 namespaces); writes bench/SHARDS.md.
N ?= 3000
bench: deps $(VENV)/.bench
ifdef SHARDS
	$(PY) -m bench.shards --n $(N) --shards $(SHARDS) --namespaces 30
else
	$(PY) -m bench.run --sizes 100 500 1000
endif

# A big cluster at rest: N standing follow-mode releases (10,000 by default) measured at rest, then 1,000 of them
# released at once with 200 aborted, then at rest again; writes bench/STANDING.md (+ standing.json).
# `make bench-standing N=10000 SHARDS="1 3"`: one local cluster per shard count, in turn (python -m
# bench.standing); STANDING_FLAGS passes more, e.g. "--burst 100 --aborts 20 --idle-minutes 1" for a quick run.
STANDING_FLAGS ?=
.PHONY: bench-standing
bench-standing: N = 10000
bench-standing: deps
	$(PY) -m bench.standing --n $(N) --shards $(or $(SHARDS),1) $(STANDING_FLAGS)

# GreyRelease and Argo Rollouts on the same releases, one after the other on one local cluster; builds Argo
# Rollouts' controller on first use (e2e/build/build.sh argo). Writes bench/COMPARISON.md, comparison.json
# and comparison.png. `make compare SIZES=20` for a quick run; CUTOFF=0 leaves out the abort cut-off on real
# requests (10 aborts per controller through Traefik by default; like the data plane's e2e tests it needs root).
SIZES ?= 100 500 1000
CUTOFF ?= 10
compare: deps $(VENV)/.bench
	e2e/build/build.sh argo
	$(PY) -m bench.compare --sizes $(SIZES) --cutoff-aborts $(CUTOFF)
