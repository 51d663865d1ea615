#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from Go modules into bin/k8s/<version>-<os>-<arch>/,
# the layout KUBEBUILDER_ASSETS expects. No binary is downloaded: everything comes
# from the Go module proxy.
#
# The default version is built from the committed module in hack/controlplane.
# Any other version (make test-compat) is built from a throw-away copy of that
# module whose replace block is derived from that kubernetes release's own go.mod.
#
# Usage: hack/build-control-plane.sh <kubernetes version, e.g. 1.37.1> <output dir>
set -euo pipefail

version="${1:?kubernetes version, e.g. 1.37.1}"
out="${2:?output directory}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="${here}/controlplane"

if [[ -x "${out}/kube-apiserver" && -x "${out}/etcd" && -x "${out}/kube-controller-manager" ]]; then
  exit 0
fi

default_version="$(cd "${module}" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
default_version="${default_version#v}"
if [[ "${version}" != "${default_version}" ]]; then
  work="$(mktemp -d)"
  trap 'rm -rf "${work}"' EXIT
  kube_mod="$(cd "${module}" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  etcd_version="$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*/\1/p' "${kube_mod}")"
  {
    sed -n '1,/^go /p' "${module}/go.mod"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "${kube_mod}" | awk -v v="v0.${version#1.}" '/=>/ {print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"${work}/go.mod"
  (cd "${work}" && go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v${version}" "k8s.io/kubernetes/cmd/kube-controller-manager@v${version}" "go.etcd.io/etcd/server/v3@${etcd_version}")
  module="${work}"
fi

IFS=. read -r major minor _ <<<"${version}"
pkg=k8s.io/component-base/version
ldflags="-s -w -X ${pkg}.gitVersion=v${version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"

mkdir -p "${out}"
cd "${module}"
echo "Building the missing ones of kube-apiserver, kube-controller-manager v${version} and etcd into ${out} (first build takes several minutes)"
# Each binary is built only if missing, so a directory built before
# kube-controller-manager joined (its in-tree StorageVersionMigration
# controller runs in the e2e suite) gains it alone.
build() {
  local name="$1" pkg="$2" flags="$3"
  if [[ ! -x "${out}/${name}" ]]; then
    CGO_ENABLED=0 go build -trimpath -ldflags "${flags}" -o "${out}/${name}.tmp" "${pkg}"
    mv "${out}/${name}.tmp" "${out}/${name}"
  fi
}
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "${ldflags}"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "${ldflags}"
build etcd go.etcd.io/etcd/server/v3 "-s -w"
echo "Built the control plane v${version} in ${SECONDS}s"
