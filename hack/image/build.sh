#!/usr/bin/env bash
# Builds the image an operator installs, from the Dockerfile as it is, on a machine where no image
# can be pulled: the Python base is assembled from Debian's packages (mmdebstrap) and stands in for
# python:3.11-slim-bookworm through the Dockerfile's PYTHON_IMAGE argument; buildah builds the
# Dockerfile (RUN --mount included) and writes the result as an OCI archive that a node's
# container runtime imports without a registry.
#
#   hack/image/build.sh            base (once) + image + archive
#
# Everything lands in $PEERS_DIR/image (default .peers/image, ignored by git): base-<stamp>.tar,
# buildah's storage, and one folder per build, builds/<sources>/ (scheduling-webhook.oci.tar, the
# tag in scheduling-webhook.tag). Clones sharing PEERS_DIR may hold different sources at the same
# time, so each finds its own build through the file .image in its work tree (ignored by git),
# never through a name another clone's build would overwrite. The newest builds are kept.
# The base is rebuilt only when its recipe below changes. The image is rebuilt only when what the
# Dockerfile copies changed (stamp: the Dockerfile, pyproject.toml, README.md, constraints.txt,
# webhook/), and then without buildah's layer cache: buildah keys a `RUN --mount=...from=builder`
# step by its text, not by the mounted content as BuildKit does, so a cached step would install the
# previous wheel into the new image.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PEERS_DIR=${PEERS_DIR:-.peers}
[[ $PEERS_DIR == /* ]] || PEERS_DIR=$REPO/$PEERS_DIR
OUT=$PEERS_DIR/image
mkdir -p "$OUT"

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

# Debian's bookworm is what python:3.11-slim-bookworm is made from; its python3 is 3.11.
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-pip,ca-certificates
BASE_TAG=localhost/python-base:3.11-$SUITE
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
TAG=localhost/scheduling-webhook:$VERSION
KEEP_BUILDS=4

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v buildah >/dev/null || missing+=(buildah)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" uidmap >/dev/null
  else
    die "needs ${missing[*]} (Debian: apt-get install mmdebstrap buildah)"
  fi
fi

# One lock per output folder: two clones sharing PEERS_DIR build one after the other.
exec 8>"$OUT/.lock"
flock -n 8 || { say "another image build into $OUT is running: waiting for it"; flock 8; }

B=(buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver vfs)

# The base: Debian's python3 and pip, without recommends, docs or apt lists. Debian marks its
# Python externally managed (PEP 668); the slim image it stands in for has no such marker, and the
# Dockerfile's `pip install` runs as root into /usr/local, as it does there.
stamp=$(printf '%s\n' "$SUITE" "$PACKAGES" "$(sed -n '/^build_base()/,/^}/p' "$0")" | sha256sum | cut -c1-16)
build_base() {
  local tar=$1
  mmdebstrap --variant=minbase --include="$PACKAGES" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    "$SUITE" "$tar" "$MIRROR"
}
base_tar=$OUT/base-$stamp.tar
base_label=$("${B[@]}" inspect --type image --format '{{index .OCIv1.Config.Labels "base-stamp"}}' "$BASE_TAG" 2>/dev/null || true)
if [ ! -f "$base_tar" ] || [ "$base_label" != "$stamp" ]; then
  start=$SECONDS
  if [ ! -f "$base_tar" ]; then
    say "assembling the Python base from Debian $SUITE ($PACKAGES)"
    # mmdebstrap picks its output format by the name's ending: keep .tar on the partial file.
    rm -rf "$base_tar.part.tar"
    build_base "$base_tar.part.tar" >"$OUT/base.log" 2>&1 || { tail -20 "$OUT/base.log" >&2; die "mmdebstrap failed (log above)"; }
    mv "$base_tar.part.tar" "$base_tar"
  fi
  ctr=$("${B[@]}" from scratch)
  "${B[@]}" add "$ctr" "$base_tar" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label "base-stamp=$stamp" "$ctr"
  "${B[@]}" commit -q --rm "$ctr" "$BASE_TAG" >/dev/null
  say "base $BASE_TAG ready in $((SECONDS - start)) s"
fi

# The Dockerfile unchanged but for its base. pip in the builder stage reaches the package index
# through this machine's TLS trust: the host's CA bundle is bind-mounted for the RUN steps only,
# so nothing of it becomes a layer.
sources=$( { sha256sum Dockerfile pyproject.toml README.md constraints.txt
             find webhook -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum; } |
           sha256sum | cut -c1-16)
build=$OUT/builds/$sources-$stamp
if [ -f "$build/scheduling-webhook.oci.tar" ] && [ -f "$build/scheduling-webhook.tag" ]; then
  printf '%s\n' "$build" >"$REPO/.image"
  touch "$build"  # the newest builds are the ones kept
  say "$TAG up to date ($build/scheduling-webhook.oci.tar)"
  exit 0
fi
start=$SECONDS
say "building $TAG from the Dockerfile"
"${B[@]}" build --isolation chroot --no-cache \
  --build-arg "PYTHON_IMAGE=$BASE_TAG" --build-arg "VERSION=$VERSION" \
  -v /etc/ssl/certs:/etc/ssl/certs:ro \
  -t "$TAG" -f Dockerfile . >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log" >&2; die "buildah build failed (log above)"; }
rm -rf "$build.part" && mkdir -p "$build.part"
"${B[@]}" push -q "$TAG" "oci-archive:$build.part/scheduling-webhook.oci.tar:$TAG" >/dev/null
printf '%s\n' "$TAG" >"$build.part/scheduling-webhook.tag"
rm -rf "$build" && mv "$build.part" "$build"
printf '%s\n' "$build" >"$REPO/.image"
"${B[@]}" rmi --prune >/dev/null 2>&1 || true  # the images this build replaced
# Builds beyond the newest few go (a clone still pointing at one rebuilds it with `make image`).
ls -1dt "$OUT"/builds/*/ 2>/dev/null | tail -n +$((KEEP_BUILDS + 1)) | xargs -r rm -rf
size=$("${B[@]}" images --format '{{.Size}}' "$TAG")
say "$TAG built in $((SECONDS - start)) s: $size, archive $(du -h "$build/scheduling-webhook.oci.tar" | cut -f1) at $build"
