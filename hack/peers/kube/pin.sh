#!/usr/bin/env bash
# Pins a Kubernetes release for the test control plane: hack/peers/kube/pin.sh v1.37.2 writes
# hack/peers/kube/v1.37.2/ (go.mod, go.sum, ldflags); the binaries list beside this script is shared
# by every release. k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging paths, which only its own repository has. As our main module we replace each of them with
# the published staging module of the same release (v1.X.Y -> v0.X.Y), generated from that release's
# go.mod so the list is right for any release; etcd is built at the version Kubernetes itself pins.
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: pin.sh v1.X.Y}
staging=v0.${version#v1.}
minor=$(echo "$version" | cut -d. -f2)
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
godebug=$(grep '^godebug' "$gomod" || true)
gover=$(sed -n 's/^go \(.*\)/\1/p' "$gomod")
mkdir -p "$version"
cd "$version"
cat > go.mod <<MOD
// Test infrastructure only: pins the real Kubernetes control plane the tests run against.
module scheduling-webhook/hack/peers/kube

go $gover

$godebug
MOD
for m in $(awk '$2 == "v0.0.0" { print $1 }' "$gomod"); do go mod edit "-replace=$m=$m@$staging"; done
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$gomod")
rm -f go.sum
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$version" "k8s.io/kubernetes/cmd/kube-controller-manager@$version" \
  "k8s.io/kubernetes/cmd/kube-scheduler@$version" "k8s.io/kubernetes/cmd/kubectl@$version" "go.etcd.io/etcd/server/v3@$etcd" \
  "k8s.io/kubernetes/cmd/kubelet@$version" "k8s.io/kubernetes/cmd/kube-proxy@$version"
go mod edit -fmt
stamp="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
cat > ldflags <<FLAGS
-s -w
$stamp
${stamp//component-base\/version/client-go\/pkg\/version}
FLAGS
echo "pinned k8s.io/kubernetes $version (staging $staging, etcd $etcd)"
