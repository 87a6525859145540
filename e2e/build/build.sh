#!/usr/bin/env bash
# Builds the local cluster's binaries from Go modules into a versioned cache outside the repository:
#   kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes), etcd, kwok.
# Idempotent: when every binary is present and answers --version, it returns at once.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
CACHE=${GREYRELEASE_CACHE:-$HOME/.cache/greyrelease}
BIN="$CACHE/k8s-v$K8S_VERSION/bin"
HERE=$(cd "$(dirname "$0")" && pwd)

have() { [ -x "$BIN/$1" ] && "$BIN/$1" --version >/dev/null 2>&1; }

if have kube-apiserver && have kube-controller-manager && have kube-scheduler && have etcd && have kwok; then
  echo "cluster binaries present in $BIN"
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

build_etcd
build_kwok
build_kube
echo "cluster binaries ready in $BIN"
