#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules into a versioned cache outside the repository:
#   kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes), etcd, kwok, and the data
#   plane's proxy, traefik (github.com/traefik/traefik/v3), and metrics-server (sigs.k8s.io/metrics-server).
# Idempotent: when every binary is present and answers --version, it returns at once.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
TRAEFIK_VERSION=${TRAEFIK_VERSION:-3.6.12}
GATEWAY_API_VERSION=${GATEWAY_API_VERSION:-1.4.1}
CACHE=${GREYRELEASE_CACHE:-$HOME/.cache/greyrelease}
BIN="$CACHE/k8s-v$K8S_VERSION/bin"
# The Gateway API standard-channel CRDs, as the sigs.k8s.io/gateway-api module ships them.
CRDS="$CACHE/k8s-v$K8S_VERSION/crd/gateway-api-v$GATEWAY_API_VERSION"
HERE=$(cd "$(dirname "$0")" && pwd)

have() {
  [ -x "$BIN/$1" ] || return 1
  # The output is read whole before grep: `grep -q` quitting at the first line would leave the writer a SIGPIPE,
  # and pipefail would take that for a missing binary (and build it again).
  if [ "$1" = traefik ]; then grep -q "v$TRAEFIK_VERSION\$" <<<"$("$BIN/traefik" version 2>/dev/null)"; return; fi
  "$BIN/$1" --version >/dev/null 2>&1
}

have_crds() { [ -s "$CRDS/gateway.networking.k8s.io_httproutes.yaml" ]; }

# --- Argo Rollouts' controller, for bench/compare/ only: `build.sh argo` (or GREYRELEASE_BUILD_ARGO=1) ----
# Not part of the cluster: built only on request, after the cluster binaries. Its go.mod asks for a newer
# Go than Kubernetes does (GOTOOLCHAIN is set for this build only), and like Traefik its dependencies
# resolve only with its own replace directives (k8s.io/* pinned, two forks), which `go install` would
# ignore: the wrapper module e2e/build/argo (committed with its go.sum) repeats them. Its CRDs are copied
# beside the binaries, from the module's manifests/crds (a kustomization).
ARGO_VERSION=${ARGO_VERSION:-1.10.2}
ARGO_GOTOOLCHAIN=${ARGO_GOTOOLCHAIN:-go1.27.3}
ARGO_CRDS="$CACHE/k8s-v$K8S_VERSION/crd/argo-rollouts-v$ARGO_VERSION"

have_argo() {
  [ -x "$BIN/rollouts-controller" ] && [ -s "$ARGO_CRDS/kustomization.yaml" ] &&
    "$BIN/rollouts-controller" --version 2>/dev/null | grep -q "v$ARGO_VERSION"
}

build_argo() (
  if have_argo; then echo "rollouts-controller v$ARGO_VERSION present in $BIN"; return 0; fi
  command -v go >/dev/null || { echo "error: Go >= 1.21 is needed to build rollouts-controller" >&2; exit 1; }
  export GOTOOLCHAIN=$ARGO_GOTOOLCHAIN CGO_ENABLED=0 GOFLAGS=-mod=mod
  local mod="$HERE/argo" info gomod dir
  mkdir -p "$BIN" "$mod"
  info=$(go mod download -json "github.com/argoproj/argo-rollouts@v$ARGO_VERSION")
  gomod=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <<<"$info")
  dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$info")
  if ! grep -q "github.com/argoproj/argo-rollouts v$ARGO_VERSION" "$mod/go.mod" 2>/dev/null; then
    echo "generating $mod/go.mod for Argo Rollouts v$ARGO_VERSION"
    rm -f "$mod/go.mod" "$mod/go.sum"
    (cd "$mod" && go mod init greyrelease.io/e2e/argo >/dev/null 2>&1)
    (cd "$mod" && go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$gomod")")
    awk '/^replace \($/ {b=1; next} b && /^\)/ {b=0} b && $2=="=>" {print $1"="$3"@"$4}
         /^replace [^(]/ && $3=="=>" {print $2"="$4"@"$5}' "$gomod" |
      while read -r r; do (cd "$mod" && go mod edit -replace="$r"); done
    (cd "$mod" && go get "github.com/argoproj/argo-rollouts/cmd/rollouts-controller@v$ARGO_VERSION")
  fi
  echo "building rollouts-controller v$ARGO_VERSION"
  # The module zip carries no commit, so the version reads v$ARGO_VERSION+unknown.
  local pkg=github.com/argoproj/argo-rollouts/utils/version
  (cd "$mod" && go build -trimpath \
     -ldflags "-s -w -X $pkg.version=$ARGO_VERSION -X $pkg.buildDate=$(date -u -r "$gomod" +%Y-%m-%dT%H:%M:%SZ)" \
     -o "$BIN/rollouts-controller" github.com/argoproj/argo-rollouts/cmd/rollouts-controller)
  mkdir -p "$ARGO_CRDS"
  cp "$dir"/manifests/crds/*.yaml "$ARGO_CRDS"/
  chmod u+w "$ARGO_CRDS"/*.yaml  # the module cache is read-only
  echo "rollouts-controller ready in $BIN, its CRDs in $ARGO_CRDS"
)

# --- metrics-server, for the tests with a real HorizontalPodAutoscaler ------------------------------------
# A program, built from its Go module through the wrapper module e2e/build/metrics-server (committed with its
# go.sum: `go get -tool` records it there). Not started with the cluster: the `metrics_server` fixture of
# e2e/conftest.py starts it for the tests that ask for it. Built when missing, like the cluster's binaries.
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-0.8.0}

have_metrics_server() {
  [ -x "$BIN/metrics-server" ] && grep -q "v$METRICS_SERVER_VERSION\$" <<<"$("$BIN/metrics-server" --version 2>/dev/null)"
}

build_metrics_server() (
  have_metrics_server && return 0
  local mod="$HERE/metrics-server" pkg=sigs.k8s.io/metrics-server/cmd/metrics-server
  mkdir -p "$BIN" "$mod"
  if ! grep -q "sigs.k8s.io/metrics-server v$METRICS_SERVER_VERSION" "$mod/go.mod" 2>/dev/null; then
    echo "generating $mod/go.mod for metrics-server v$METRICS_SERVER_VERSION"
    rm -f "$mod/go.mod" "$mod/go.sum"
    (cd "$mod" && go mod init greyrelease.io/e2e/metrics-server >/dev/null 2>&1)
    (cd "$mod" && go get -tool "$pkg@v$METRICS_SERVER_VERSION")
  fi
  echo "building metrics-server v$METRICS_SERVER_VERSION"
  # Its version is client-go's, set at link time as its own Makefile does.
  (cd "$mod" && go build -trimpath \
     -ldflags "-s -w -X k8s.io/client-go/pkg/version.gitVersion=v$METRICS_SERVER_VERSION" \
     -o "$BIN/metrics-server" "$pkg")
)

if [ "${1:-}" = argo ]; then build_argo; exit; fi
WANT_ARGO=${GREYRELEASE_BUILD_ARGO:-0}  # 1: the cluster binaries, then rollouts-controller

# --- the Helm chart's tools (e2e/test_chart.py): helm, and the ServiceMonitor CRD ------------------------
# helm from its module (no replace directives: `go install` builds it as released; the version is stamped as
# its own Makefile does). The Prometheus Operator's ServiceMonitor CRD, copied from its module's
# example/prometheus-operator-crd, lets the API server check the chart's ServiceMonitor in a dry run.
# Each only when missing, before the cluster binaries' early return.
HELM_VERSION=${HELM_VERSION:-4.3.2}
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-0.85.0}
MONITORING_CRDS="$CACHE/k8s-v$K8S_VERSION/crd/prometheus-operator-v$PROMETHEUS_OPERATOR_VERSION"

build_chart_tools() (
  if [ -x "$BIN/helm" ] && [ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" = "v$HELM_VERSION" ] &&
     [ -s "$MONITORING_CRDS/monitoring.coreos.com_servicemonitors.yaml" ]; then
    echo "helm v$HELM_VERSION and the ServiceMonitor CRD present"; return 0
  fi
  command -v go >/dev/null || { echo "error: Go >= 1.21 is needed to build helm" >&2; exit 1; }
  export CGO_ENABLED=0 GOFLAGS=-mod=mod
  mkdir -p "$BIN" "$MONITORING_CRDS"
  if [ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" != "v$HELM_VERSION" ]; then
    echo "building helm v$HELM_VERSION"
    GOBIN="$BIN" go install -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
      "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
  fi
  local dir
  dir=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$MONITORING_CRDS"/
  chmod u+w "$MONITORING_CRDS"/*.yaml  # the module cache is read-only
  echo "helm v$HELM_VERSION in $BIN, the ServiceMonitor CRD in $MONITORING_CRDS"
)
build_chart_tools

if have kube-apiserver && have kube-controller-manager && have kube-scheduler && have etcd && have kwok && have traefik &&
   have_crds && have_metrics_server; then
  echo "cluster binaries present in $BIN"
  if [ "$WANT_ARGO" = 1 ]; then build_argo; fi
  exit 0
fi

command -v go >/dev/null || { echo "error: Go >= 1.21 is needed to build the local cluster binaries" >&2; exit 1; }
# Kubernetes 1.37 needs Go 1.26; Go >= 1.21 fetches that toolchain from the module proxy by itself
# (GOTOOLCHAIN=auto). Older Go, such as Debian 12's golang-go 1.19, cannot.
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [ "${go_minor:-0}" -lt 21 ] 2>/dev/null; then
  echo "error: $(go env GOVERSION) is too old; install Go >= 1.21 (https://go.dev/dl/)" >&2
  exit 1
fi
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# --- kube-apiserver, kube-controller-manager, kube-scheduler ---------------------------------------
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 with
# replace directives into ./staging; replaces of a dependency are ignored, so our wrapper module pins
# each of them to the published v0.<minor>.<patch>. The list is read from the downloaded go.mod.
build_kube() {
  local mod="$HERE/k8s" sv="v0.${K8S_VERSION#*.}"
  if ! grep -q "k8s.io/kubernetes v$K8S_VERSION" "$mod/go.mod" 2>/dev/null; then
    echo "generating $mod/go.mod for Kubernetes v$K8S_VERSION"
    rm -f "$mod/go.mod" "$mod/go.sum"
    (cd "$mod" && go mod init greyrelease.io/e2e/k8s >/dev/null 2>&1)
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    local goline
    goline=$(awk '$1=="go"{print $2; exit}' "$gomod")
    (cd "$mod" && go mod edit -go="$goline")
    for m in $(awk '$1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$gomod" | sort -u); do
      (cd "$mod" && go mod edit -replace="$m=$m@$sv")
    done
    (cd "$mod" && go get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
                        "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
                        "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION")
  fi
  local minor=${K8S_VERSION#*.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    have "$c" && continue
    echo "building $c v$K8S_VERSION"
    (cd "$mod" && go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$BIN/$c" "k8s.io/kubernetes/cmd/$c")
  done
}

# --- etcd: a tiny main around etcdmain.Main (Debian's etcd is too old for current Kubernetes) ------
build_etcd() {
  have etcd && return 0
  local mod="$HERE/etcd"
  if ! grep -q "go.etcd.io/etcd/server/v3 v$ETCD_VERSION" "$mod/go.mod" 2>/dev/null; then
    echo "generating $mod/go.mod for etcd v$ETCD_VERSION"
    rm -f "$mod/go.mod" "$mod/go.sum"
    (cd "$mod" && go mod init greyrelease.io/e2e/etcd >/dev/null 2>&1 &&
      go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" "go.etcd.io/etcd/api/v3@v$ETCD_VERSION" \
             "go.etcd.io/etcd/client/v3@v$ETCD_VERSION" "go.etcd.io/etcd/client/pkg/v3@v$ETCD_VERSION" \
             "go.etcd.io/etcd/pkg/v3@v$ETCD_VERSION" && go mod tidy)
  fi
  echo "building etcd v$ETCD_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .)
}

# --- kwok ----------------------------------------------------------------------------------------------
build_kwok() {
  have kwok && return 0
  echo "building kwok v$KWOK_VERSION"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
}

# --- traefik: the data plane's proxy ------------------------------------------------------------------
# `go install module@version` ignores the module's replace and exclude directives, and Traefik's
# dependencies only resolve with them (three forks under github.com/containous, and an excluded
# tencentcloud-sdk-go version that is not served). So a wrapper module (e2e/build/traefik, committed
# with its go.sum) repeats them, read from Traefik's own go.mod when the version changes.
build_traefik() {
  have traefik && return 0
  local mod="$HERE/traefik"
  if ! grep -q "github.com/traefik/traefik/v3 v$TRAEFIK_VERSION" "$mod/go.mod" 2>/dev/null; then
    echo "generating $mod/go.mod for Traefik v$TRAEFIK_VERSION"
    rm -f "$mod/go.mod" "$mod/go.sum"
    mkdir -p "$mod"
    (cd "$mod" && go mod init greyrelease.io/e2e/traefik >/dev/null 2>&1)
    local gomod
    gomod=$(go mod download -json "github.com/traefik/traefik/v3@v$TRAEFIK_VERSION" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    (cd "$mod" && go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$gomod")")
    # `old => new version` lines, inside a replace ( ... ) block or alone; and `exclude path version`.
    awk '/^replace \($/ {b=1; next} b && /^\)/ {b=0} b && $2=="=>" {print $1"="$3"@"$4}
         /^replace [^(]/ && $3=="=>" {print $2"="$4"@"$5}' "$gomod" |
      while read -r r; do (cd "$mod" && go mod edit -replace="$r"); done
    awk '/^exclude \($/ {b=1; next} b && /^\)/ {b=0} b && NF>=2 {print $1"@"$2}
         /^exclude [^(]/ {print $2"@"$3}' "$gomod" |
      while read -r e; do (cd "$mod" && go mod edit -exclude="$e"); done
    (cd "$mod" && go get "github.com/traefik/traefik/v3/cmd/traefik@v$TRAEFIK_VERSION")
  fi
  echo "building traefik v$TRAEFIK_VERSION"
  (cd "$mod" && go build -trimpath \
     -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=v$TRAEFIK_VERSION" \
     -o "$BIN/traefik" github.com/traefik/traefik/v3/cmd/traefik)
}

# --- the Gateway API CRDs (standard channel): copied from the module, config/crd/standard ------------
fetch_gateway_api_crds() {
  have_crds && return 0
  echo "copying the Gateway API v$GATEWAY_API_VERSION standard CRDs"
  local dir
  dir=$(go mod download -json "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$CRDS"
  cp "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$CRDS"/
  chmod u+w "$CRDS"/*.yaml  # the module cache is read-only
}

build_etcd
build_kwok
build_kube
build_traefik
fetch_gateway_api_crds
build_metrics_server
echo "cluster binaries ready in $BIN, Gateway API CRDs in $CRDS"
if [ "$WANT_ARGO" = 1 ]; then build_argo; fi
