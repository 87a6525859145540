#!/usr/bin/env bash
# Builds the controller image from the project's Dockerfile where no container engine runs and no
# registry can be reached, then smoke-checks it. Run as root on Debian (`make image-local`):
#   - buildah and debootstrap come from Debian's packages, installed when missing;
#   - the base is Debian bookworm's minimal system plus python3 (3.11, as in python:3.11-slim),
#     made once with debootstrap and cached as a tarball under ~/.cache/greyrelease/image;
#   - the Dockerfile gets it as --build-arg BASE; the result is localhost/$IMAGE in buildah's storage.
# Environment: IMAGE (greyrelease:0.1.0), BASE (the local base's name), DEBIAN_MIRROR (debootstrap's
# default when empty), BUILDAH_ISOLATION (chroot), STORAGE_DRIVER (buildah's default; vfs if overlay fails).
set -euo pipefail

IMAGE=${IMAGE:-greyrelease:0.1.0}
BASE=${BASE:-localhost/greyrelease-base:bookworm}
SUITE=bookworm
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/greyrelease/image
TARBALL=$CACHE/$SUITE-python3.tar
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# chroot isolation: RUN steps need neither cgroups nor a network namespace (they use the host's network).
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root: buildah (rootful storage) and debootstrap need it"
SECONDS=0

# 1. The tools, only when missing.
missing=()
for tool in buildah debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  say "installing ${missing[*]} from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. The base. debootstrap runs once; buildah's storage gets the tarball again whenever it lacks the base.
if [ ! -s "$TARBALL" ]; then
  say "debootstrap $SUITE with python3 (once; cached in $TARBALL)"
  mkdir -p "$CACHE"
  dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$dir" ${DEBIAN_MIRROR:-} \
    >"$CACHE/debootstrap.log" 2>&1 || { tail -n 20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
  # Left out, as in the slim images: downloaded packages and lists, docs, translations; and the
  # build host's name and resolver, which a container runtime provides.
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin "$dir"/var/lib/apt/lists/* \
    "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* "$dir"/usr/share/locale/* \
    "$dir"/etc/hostname "$dir"/etc/resolv.conf
  tar -C "$dir" --numeric-owner -cf "$TARBALL.part" . && mv "$TARBALL.part" "$TARBALL"
  rm -rf "$dir" && trap - EXIT
  buildah rmi "$BASE" >/dev/null 2>&1 || true  # made from an older tarball
fi
if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  say "importing the base as $BASE"
  ctr=$(buildah from scratch)
  tar -C "$(buildah mount "$ctr")" --numeric-owner -xpf "$TARBALL"
  buildah umount "$ctr" >/dev/null
  buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 "$ctr"
  buildah commit --rm --quiet "$ctr" "$BASE" >/dev/null
fi

# 3. The image. Debian's pip trusts the system CA bundle, so the host's bundle is bound over the
# base's while RUN steps run: a TLS-inspecting proxy the host trusts works for pip in the build,
# and the image keeps Debian's own bundle.
say "building $IMAGE on $BASE"
ca=/etc/ssl/certs/ca-certificates.crt
buildah build --layers --force-rm --pull-never --build-arg BASE="$BASE" -v "$ca:$ca:ro" -t "$IMAGE" "$ROOT"

# 4. Smoke check: commands in the image, as the image's user, on its file system mounted read-only
# (in a mount namespace of their own, so nothing stays mounted), with only the image's environment.
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$IMAGE")
user=${user:-0:0}
entry=$(buildah inspect --type image --format '{{index .OCIv1.Config.Entrypoint 0}}' "$IMAGE")
mapfile -t envs < <(buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$IMAGE")
ctr=$(buildah from --pull-never "$IMAGE")
trap 'buildah rm "$ctr" >/dev/null' EXIT
rootfs=$(buildah mount "$ctr")
in_image() {
  unshare --mount --propagation private -- sh -c 'r=$1; u=$2; shift 2
    mount --bind "$r" "$r" && mount -o remount,bind,ro "$r" && exec chroot --userspec="$u" "$r" "$@"' \
    - "$rootfs" "$user" env -i "${envs[@]}" "$@"
}
say "smoke check (user $user, read-only root file system)"
uid=$(in_image id -u)
[ -n "$uid" ] && [ "$uid" != 0 ] || die "the image runs as root"
err=$(in_image sh -c ': > /opt/greyrelease/probe' 2>&1) && die "the root file system is writable"
[[ $err == *"Read-only file system"* ]] || die "writing in the image failed otherwise: $err"
in_image "$entry" crd >"$CACHE/crd.yaml" || die "'$entry crd' failed in the image"
{ cat "$ROOT/crds/greyrelease.io_greyreleases.yaml"; echo ---; cat "$ROOT/crds/greyrelease.io_greyreleasepolicies.yaml"; } \
  | diff -u - "$CACHE/crd.yaml" >&2 || die "'$entry crd' in the image differs from the CRDs in crds/"
say "ok: uid $uid, read-only root, '$entry crd' matches the CRDs in crds/ (${SECONDS}s)"
buildah images --format '{{.Name}}:{{.Tag}}  {{.ID}}  {{.Size}}' "$IMAGE"
