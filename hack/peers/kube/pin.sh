#!/usr/bin/env bash
# Re-pins this module to a Kubernetes release: hack/peers/kube/pin.sh v1.35.4
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging paths,
# which only its own repository has. As our main module we replace each of them with the published
# staging module of the same release (v1.X.Y -> v0.X.Y), generated from that release's go.mod so
# the list is right for any release; etcd is built at the version Kubernetes itself pins.
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: pin.sh v1.X.Y}
staging=v0.${version#v1.}
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
godebug=$(grep '^godebug' "$gomod" || true)
gover=$(sed -n 's/^go \(.*\)/\1/p' "$gomod")
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
  "k8s.io/kubernetes/cmd/kube-scheduler@$version" "k8s.io/kubernetes/cmd/kubectl@$version" \
  "k8s.io/kubernetes/cmd/kubelet@$version" "k8s.io/kubernetes/cmd/kube-proxy@$version" "go.etcd.io/etcd/server/v3@$etcd"
go mod edit -fmt
sed -i "s/gitVersion=v[0-9.]*/gitVersion=$version/g; s/gitMinor=[0-9]*/gitMinor=$(echo "$version" | cut -d. -f2)/g" ldflags
echo "pinned k8s.io/kubernetes $version (staging $staging, etcd $etcd)"
