#!/usr/bin/env bash
# Pins this module to a KAI-Scheduler release: hack/peers/kai/pin.sh v0.17.0
# Writes go.mod and go.sum for KAI's admission webhook (cmd/admission). KAI's own go.mod carries
# replace directives (v0.17.0: k8s.io/api and k8s.io/apimachinery => v0.35.4); a dependency's
# replaces are ignored, so they are copied from that release's go.mod into ours, as is its go line.
# Until a go.mod exists here, `hack/peers/build.sh` (and `make peers`) leaves this module out.
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: pin.sh v0.X.Y}
module=github.com/kai-scheduler/KAI-scheduler
info=$(go mod download -json "$module@$version") || {
  printf 'kai: the Go module proxy (GOPROXY=%s) does not serve %s@%s:\n%s\n' "$(go env GOPROXY)" "$module" "$version" \
    "$(printf '%s' "$info" | sed -n 's/.*"Error": "\(.*\)".*/\1/p' | sed 's/\\n\\t/ /g')" >&2
  exit 2
}
gomod=$(printf '%s' "$info" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
gover=$(sed -n 's/^go \(.*\)/\1/p' "$gomod")
cat > go.mod.new <<MOD
// Test infrastructure only: KAI-Scheduler's admission webhook, built from its Go module.
module scheduling-webhook/hack/peers/kai

go $gover
MOD
grep -E '^replace ' "$gomod" >> go.mod.new || true
mv go.mod.new go.mod
rm -f go.sum
go get -tool "$module/cmd/admission@$version"
go mod edit -fmt
echo "pinned $module $version ($(grep -c '^replace ' go.mod) replaces from its go.mod)"
