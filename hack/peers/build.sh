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
# A peer the Go module proxy does not serve comes as a source tarball in the shared folder
# ($SCHEDULING_WEBHOOK_SHARED, default ../shared beside the clone): its module folder has a
# `source` file (tarball path in the shared folder, sha256, folder under $PEERS_DIR/src) instead of
# go.mod/go.sum. The tarball is checked and extracted there, and the packages in `binaries` are
# built inside the extracted tree, with its own go.mod; `files` then names paths in that tree
# (module `.`).
#
# A module may also be a program of ours (its own .go files beside go.mod: the nodes' pause), or
# name in `debian` the Debian packages it stands for (name, then the command that shows it is
# there): installed with apt-get when missing, as the image build installs buildah (runc).
#
# Binaries go to $PEERS_DIR/bin (default .peers/bin, ignored by git). A module whose inputs are
# unchanged since its last build (stamp: go.mod, go.sum, binaries, ldflags, Go version) and whose
# binaries are all there is not built again: a second run builds nothing and calls no go command.
set -euo pipefail
cd "$(dirname "$0")"
PEERS_HACK=$PWD
REPO=$(cd ../.. && pwd)
SHARED=${SCHEDULING_WEBHOOK_SHARED:-$REPO/../shared}
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

# The tree a `source` module builds in: the tarball extracted under $PEERS_DIR/src, checked
# against its sha256; an extraction already there is kept when tar finds it equal to the tarball
# (so a second clone sharing PEERS_DIR, or a tree another build is reading, is not replaced).
source_tree() {
  local module=$1 tarball sum folder
  read -r tarball sum folder < <(grep -v '^#' "$PEERS_HACK/$module/source" | grep -m1 .)
  local file=$SHARED/$tarball dest=$PEERS_DIR/src/$folder
  if [ -f "$dest/.sha256" ] && [ "$(cat "$dest/.sha256")" = "$sum" ] && [ -f "$dest/.top" ]; then
    printf '%s' "$dest/$(cat "$dest/.top")"; return
  fi
  [ -f "$file" ] || die "$module: no $file (its source tarball; set SCHEDULING_WEBHOOK_SHARED to the shared folder)"
  [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$sum" ] || die "$module: $file does not have sha256 $sum"
  local top
  top=$(tar -tzf "$file" | sed -n '1s,/.*,,p')  # (sed reads it all: no SIGPIPE under pipefail)
  if ! { [ -d "$dest/$top" ] && tar -dzf "$file" -C "$dest" >/dev/null 2>&1; }; then
    say "$module: extracting $tarball into $dest"
    rm -rf "$dest.new"; mkdir -p "$dest.new"
    tar -xzf "$file" -C "$dest.new"
    rm -rf "$dest"; mv "$dest.new" "$dest"
  fi
  printf '%s\n' "$top" > "$dest/.top"
  printf '%s\n' "$sum" > "$dest/.sha256"
  printf '%s' "$dest/$top"
}

install_debian() {
  local module=$1 dir=$PEERS_HACK/$1 missing=()
  while read -r package command _; do
    [[ -z ${package:-} || $package == \#* ]] && continue
    command -v "$command" >/dev/null || missing+=("$package")
  done < "$dir/debian"
  if [ ${#missing[@]} -eq 0 ]; then say "$module: up to date (Debian's)"; return; fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "$module: installing ${missing[*]} from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "$module: needs ${missing[*]} (Debian: apt-get install ${missing[*]})"
  fi
}

build_module() {
  local module=$1 dir=$PEERS_HACK/$1 tree=""
  if [ -f "$dir/debian" ]; then install_debian "$module"; return; fi
  if [ -f "$dir/source" ]; then
    tree=$(source_tree "$module")
  else
    [ -f "$dir/go.mod" ] || die "no module $module (hack/peers/$module/go.mod)"
  fi
  local srcdir=${tree:-$dir}
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
  stamp=$( { cat "$dir/go.mod" "$dir/go.sum" "$dir/source" "$dir"/*.go 2>/dev/null || true; cat "$dir/binaries" "$dir/files" 2>/dev/null || true; printf '%s\n%s\n' "$ldflags" "$GO_VERSION"; } | sha256sum | cut -d' ' -f1)
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
  if ! err=$(cd "$srcdir" && go list -m all 2>&1 >/dev/null); then
    die "$module: cannot download its Go modules from GOPROXY=$(go env GOPROXY): $(printf '%s' "$err" | grep -m1 -v '^go: downloading')"
  fi
  local start=$SECONDS
  if [ ${#pkgs[@]} -gt 0 ]; then
    local out="$PEERS_DIR/bin/.build-$module"
    rm -rf "$out"; mkdir -p "$out"
    say "$module: building ${names[*]} (a cold build compiles a few thousand packages; progress every 250)"
    # -v names each package as it is compiled: counted here into a progress line.
    set +e
    ( cd "$srcdir" && CGO_ENABLED=0 go build -v -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 ) |
      awk -v m="$module" '/^[a-zA-Z0-9._~\/-]+$/ { n++; if (n % 250 == 0) { printf "peers: %s: %d packages compiled\n", m, n > "/dev/stderr" } ; next } { print > "/dev/stderr" }'
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || die "$module: go build failed (exit $rc); its output is above"
    for i in "${!names[@]}"; do
      mkdir -p "$(dirname "$PEERS_DIR/bin/${names[$i]}")"  # a name may hold a folder (cni/bridge)
      mv -f "$out/$(default_name "${pkgs[$i]}")" "$PEERS_DIR/bin/${names[$i]}"
    done
    rm -rf "$out"
  fi
  copy_files "$module" "$dir" "$tree"
  printf '%s\n' "$stamp" > "$PEERS_DIR/stamps/$module"
  say "$module: done in $((SECONDS - start)) s (into $PEERS_DIR)"
}

copy_files() {
  local module=$1 dir=$2 tree=${3:-}
  [ -f "$dir/files" ] || return 0
  while read -r mod path dest _; do
    [[ -z ${mod:-} || $mod == \#* ]] && continue
    local src
    if [ "$mod" = . ]; then
      src=$tree
    else
      src=$(cd "$dir" && go mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    fi
    [ -e "$src/$path" ] || die "$module: $mod has no $path"
    rm -rf "$PEERS_DIR/share/$dest"; mkdir -p "$PEERS_DIR/share/$dest"
    cp -R "$src/$path/." "$PEERS_DIR/share/$dest/"
    chmod -R u+w "$PEERS_DIR/share/$dest"
  done < "$dir/files"
}

modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  for f in "$PEERS_HACK"/*/go.mod "$PEERS_HACK"/*/source "$PEERS_HACK"/*/debian; do
    [ -f "$f" ] && modules+=("$(basename "$(dirname "$f")")")
  done
fi
for m in "${modules[@]}"; do build_module "$m"; done
