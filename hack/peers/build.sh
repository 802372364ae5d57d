#!/usr/bin/env bash
# Builds the real peers the tests run against (kube-apiserver, etcd, kubectl, kwok, ...) from
# their Go modules: one folder under hack/peers/ per Go module of ours, pinned by its go.mod and
# go.sum, listing what it builds in `binaries` (name, package) and its linker flags in `ldflags`.
# Each module stays on its own so that MVS never raises one peer's dependencies for another.
#
#   hack/peers/build.sh [MODULE ...]     (default: every module)
#
# A module may also list in `files` data the tests read from a dependency (a module, a path in it,
# a folder under $PEERS_DIR/share): CRDs, stage configs, charts.
#
# Binaries go to $PEERS_DIR/bin (default .peers/bin, ignored by git). A module whose inputs are
# unchanged since its last build (stamp: go.mod, go.sum, binaries, ldflags, Go version) and whose
# binaries are all there is not built again: a second run builds nothing and calls no go command.
set -euo pipefail
cd "$(dirname "$0")"
PEERS_HACK=$PWD
REPO=$(cd ../.. && pwd)
PEERS_DIR=${PEERS_DIR:-.peers}
[[ $PEERS_DIR == /* ]] || PEERS_DIR=$REPO/$PEERS_DIR  # relative to the clone, as the tests read it
mkdir -p "$PEERS_DIR/bin" "$PEERS_DIR/stamps"
PEERS_DIR=$(cd "$PEERS_DIR" && pwd)

say() { printf 'peers: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

# Clones and test runs may share one PEERS_DIR: a second build.sh waits for the first instead of
# compiling into the same folders beside it (it then finds the stamps and builds nothing).
if command -v flock >/dev/null; then
  exec 9>"$PEERS_DIR/.build.lock"
  flock -n 9 || { say "another build into $PEERS_DIR is running: waiting for it"; flock 9; }
fi

command -v go >/dev/null || die "no Go toolchain on PATH: the test control plane is built from Go modules (Go 1.25 or newer, https://go.dev/dl)"
GO_VERSION=$(go env GOVERSION)

# The name `go build` gives a package's binary: its last path element, or the one before a /vN.
default_name() {
  local pkg=$1 last=${1##*/}
  if [[ $last =~ ^v[0-9]+$ ]]; then pkg=${pkg%/*}; last=${pkg##*/}; fi
  printf '%s' "$last"
}

build_module() {
  local module=$1 dir=$PEERS_HACK/$1
  if [ ! -f "$dir/go.mod" ] && [ -x "$dir/pin.sh" ]; then
    die "$module: not pinned yet (no hack/peers/$module/go.mod): run hack/peers/$module/pin.sh VERSION first"
  fi
  [ -f "$dir/go.mod" ] || die "no module $module (hack/peers/$module/go.mod)"
  local names=() pkgs=()
  if [ -f "$dir/binaries" ]; then
    while read -r name pkg _; do
      [[ -z ${name:-} || $name == \#* ]] && continue
      names+=("$name"); pkgs+=("$pkg")
    done < "$dir/binaries"
  fi
  local ldflags=""
  [ -f "$dir/ldflags" ] && ldflags=$(grep -v '^#' "$dir/ldflags" | tr '\n' ' ')
  local stamp
  stamp=$( { cat "$dir/go.mod" "$dir/go.sum"; cat "$dir/binaries" "$dir/files" 2>/dev/null || true; printf '%s\n%s\n' "$ldflags" "$GO_VERSION"; } | sha256sum | cut -d' ' -f1)
  local missing=0
  for name in "${names[@]}"; do [ -x "$PEERS_DIR/bin/$name" ] || missing=1; done
  if [ -f "$dir/files" ]; then
    while read -r mod _ dest _; do
      [[ -z ${mod:-} || $mod == \#* ]] || [ -d "$PEERS_DIR/share/$dest" ] || missing=1
    done < "$dir/files"
  fi
  if [ $missing -eq 0 ] && [ "$(cat "$PEERS_DIR/stamps/$module" 2>/dev/null)" = "$stamp" ]; then
    say "$module: up to date (${names[*]:-files only})"
    return
  fi
  say "$module: resolving modules (GOPROXY=$(go env GOPROXY))"
  local err
  # The module graph (go.mod files only): the first thing that fails when the proxy is unreachable.
  if ! err=$(cd "$dir" && go list -m all 2>&1 >/dev/null); then
    die "$module: cannot download its Go modules from GOPROXY=$(go env GOPROXY): $(printf '%s' "$err" | grep -m1 -v '^go: downloading')"
  fi
  local start=$SECONDS
  if [ ${#pkgs[@]} -gt 0 ]; then
    local out="$PEERS_DIR/bin/.build-$module"
    rm -rf "$out"; mkdir -p "$out"
    say "$module: building ${names[*]} (a cold build compiles a few thousand packages; progress every 250)"
    # -v names each package as it is compiled: counted here into a progress line.
    set +e
    ( cd "$dir" && CGO_ENABLED=0 go build -v -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 ) |
      awk -v m="$module" '/^[a-zA-Z0-9._~\/-]+$/ { n++; if (n % 250 == 0) { printf "peers: %s: %d packages compiled\n", m, n > "/dev/stderr" } ; next } { print > "/dev/stderr" }'
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || die "$module: go build failed (exit $rc); its output is above"
    for i in "${!names[@]}"; do
      mv -f "$out/$(default_name "${pkgs[$i]}")" "$PEERS_DIR/bin/${names[$i]}"
    done
    rm -rf "$out"
  fi
  copy_files "$module" "$dir"
  printf '%s\n' "$stamp" > "$PEERS_DIR/stamps/$module"
  say "$module: done in $((SECONDS - start)) s (into $PEERS_DIR)"
}

copy_files() {
  local module=$1 dir=$2
  [ -f "$dir/files" ] || return 0
  while read -r mod path dest _; do
    [[ -z ${mod:-} || $mod == \#* ]] && continue
    local src
    src=$(cd "$dir" && go mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    [ -e "$src/$path" ] || die "$module: $mod has no $path"
    rm -rf "$PEERS_DIR/share/$dest"; mkdir -p "$PEERS_DIR/share/$dest"
    cp -R "$src/$path/." "$PEERS_DIR/share/$dest/"
    chmod -R u+w "$PEERS_DIR/share/$dest"
  done < "$dir/files"
}

modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  for f in "$PEERS_HACK"/*/go.mod; do modules+=("$(basename "$(dirname "$f")")"); done
  # A module whose release the proxy does not serve yet has only its pin.sh (see kai/pin.sh).
  for f in "$PEERS_HACK"/*/pin.sh; do
    [ -f "$(dirname "$f")/go.mod" ] || say "$(basename "$(dirname "$f")"): not pinned yet, left out (hack/peers/$(basename "$(dirname "$f")")/pin.sh)"
  done
fi
for m in "${modules[@]}"; do build_module "$m"; done
