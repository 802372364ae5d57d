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
# A module built per release of something it follows (Kubernetes, Helm) is listed in `releases`
# beside this script with the variable that chooses the release and its default: its pins are in
# hack/peers/MODULE/RELEASE/ (go.mod, go.sum, and `ldflags`, `binaries`, `files` where they differ
# from the module folder's own), and what it builds goes to $PEERS_DIR/MODULE/RELEASE/bin and share,
# so that the releases live side by side: `KUBE_VERSION=v1.35.4 hack/peers/build.sh kube`.
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

# The release a module is built for ("" for a module built once): its variable in the environment,
# else the default in `releases`.
release_of() {
  local module=$1 var default mods
  while read -r var default mods; do
    [[ -z ${var:-} || $var == \#* ]] && continue
    if [[ " $mods " == *" $module "* ]]; then printf '%s' "${!var:-$default}"; return; fi
  done < "$PEERS_HACK/releases"
}

# A module's file: the release's own, else the module folder's.
module_file() {
  local dir=$1 pins=$2 name=$3
  if [ -f "$pins/$name" ]; then printf '%s' "$pins/$name"; else printf '%s' "$dir/$name"; fi
}

build_module() {
  local module=$1 dir=$PEERS_HACK/$1 tree="" release label=$1
  if [ -f "$dir/debian" ]; then install_debian "$module"; return; fi
  release=$(release_of "$module")
  local pins=$dir bin=$PEERS_DIR/bin share=$PEERS_DIR/share stampfile=$PEERS_DIR/stamps/$module
  if [ -n "$release" ]; then
    pins=$dir/$release bin=$PEERS_DIR/$module/$release/bin share=$PEERS_DIR/$module/$release/share
    stampfile=$PEERS_DIR/stamps/$module@$release label="$module $release"
    [ -f "$pins/go.mod" ] || die "$module: no release $release pinned (hack/peers/$module/$release/go.mod; pinned: $(cd "$dir" && ls -d v*/ 2>/dev/null | tr -d / | tr '\n' ' '))"
    mkdir -p "$bin" "$share"
  fi
  if [ -f "$dir/source" ]; then
    tree=$(source_tree "$module")
  else
    [ -f "$pins/go.mod" ] || die "no module $module (hack/peers/$module/go.mod)"
  fi
  local srcdir=${tree:-$pins}
  local binaries files ldflagsfile
  binaries=$(module_file "$dir" "$pins" binaries) files=$(module_file "$dir" "$pins" files)
  ldflagsfile=$(module_file "$dir" "$pins" ldflags)
  local names=() pkgs=()
  if [ -f "$binaries" ]; then
    while read -r name pkg _; do
      [[ -z ${name:-} || $name == \#* ]] && continue
      names+=("$name"); pkgs+=("$pkg")
    done < "$binaries"
  fi
  local ldflags=""
  [ -f "$ldflagsfile" ] && ldflags=$(grep -v '^#' "$ldflagsfile" | tr '\n' ' ')
  local stamp
  stamp=$( { cat "$pins/go.mod" "$pins/go.sum" "$dir/source" "$dir"/*.go 2>/dev/null || true; cat "$binaries" "$files" 2>/dev/null || true; printf '%s\n%s\n' "$ldflags" "$GO_VERSION"; } | sha256sum | cut -d' ' -f1)
  local missing=0
  for name in "${names[@]}"; do [ -x "$bin/$name" ] || missing=1; done
  if [ -f "$files" ]; then
    while read -r mod _ dest _; do
      [[ -z ${mod:-} || $mod == \#* ]] || [ -d "$share/$dest" ] || missing=1
    done < "$files"
  fi
  if [ $missing -eq 0 ] && [ "$(cat "$stampfile" 2>/dev/null)" = "$stamp" ]; then
    say "$label: up to date (${names[*]:-files only})"
    return
  fi
  say "$label: resolving modules (GOPROXY=$(go env GOPROXY))"
  local err
  # The module graph (go.mod files only): the first thing that fails when the proxy is unreachable.
  if ! err=$(cd "$srcdir" && go list -m all 2>&1 >/dev/null); then
    die "$label: cannot download its Go modules from GOPROXY=$(go env GOPROXY): $(printf '%s' "$err" | grep -m1 -v '^go: downloading')"
  fi
  local start=$SECONDS
  if [ ${#pkgs[@]} -gt 0 ]; then
    local out="$bin/.build-$module"
    rm -rf "$out"; mkdir -p "$out"
    say "$label: building ${names[*]} (a cold build compiles a few thousand packages; progress every 250)"
    # -v names each package as it is compiled: counted here into a progress line.
    set +e
    ( cd "$srcdir" && CGO_ENABLED=0 go build -v -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" 2>&1 ) |
      awk -v m="$label" '/^[a-zA-Z0-9._~\/-]+$/ { n++; if (n % 250 == 0) { printf "peers: %s: %d packages compiled\n", m, n > "/dev/stderr" } ; next } { print > "/dev/stderr" }'
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || die "$label: go build failed (exit $rc); its output is above"
    for i in "${!names[@]}"; do
      mkdir -p "$(dirname "$bin/${names[$i]}")"  # a name may hold a folder (cni/bridge)
      mv -f "$out/$(default_name "${pkgs[$i]}")" "$bin/${names[$i]}"
    done
    rm -rf "$out"
  fi
  copy_files "$label" "$pins" "$files" "$share" "$tree"
  printf '%s\n' "$stamp" > "$stampfile"
  say "$label: done in $((SECONDS - start)) s (into ${bin%/bin})"
}

copy_files() {
  local module=$1 dir=$2 list=$3 share=$4 tree=${5:-}
  [ -f "$list" ] || return 0
  while read -r mod path dest _; do
    [[ -z ${mod:-} || $mod == \#* ]] && continue
    local src
    if [ "$mod" = . ]; then
      src=$tree
    else
      src=$(cd "$dir" && go mod download -json "$mod" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    fi
    [ -e "$src/$path" ] || die "$module: $mod has no $path"
    rm -rf "${share:?}/$dest"; mkdir -p "$share/$dest"
    cp -R "$src/$path/." "$share/$dest/"
    chmod -R u+w "$share/$dest"
  done < "$list"
}

modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  for f in "$PEERS_HACK"/*/go.mod "$PEERS_HACK"/*/v*/go.mod "$PEERS_HACK"/*/source "$PEERS_HACK"/*/debian; do
    [ -f "$f" ] || continue
    m=${f#"$PEERS_HACK"/}; m=${m%%/*}
    [[ " ${modules[*]} " == *" $m "* ]] || modules+=("$m")
  done
fi
for m in "${modules[@]}"; do build_module "$m"; done
