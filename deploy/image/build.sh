#!/usr/bin/env bash
# Builds fleetscope's container image from the Containerfile with podman (no daemon).
#
#   deploy/image/build.sh [--tag NAME] [--binary FILE] [--local-base] [--base IMAGE]
#
#   --tag NAME       the image's name (default fleetscope:VERSION, VERSION from Cargo.toml)
#   --binary FILE    use this fleetscope binary instead of building from source; it is
#                    stripped of debug info into a context of its own
#   --local-base     make the runtime base here, without a registry: glibc and the
#                    libraries the binary links, the CA bundle, /etc/passwd with the
#                    nonroot user 65532 and /tmp (localhost/fleetscope-base:local)
#   --base IMAGE     the runtime base (default: the Containerfile's distroless base)
#
# Without --binary the toolchain image and the base are pulled from their registries;
# with --binary and --local-base nothing is pulled (--pull=never).
#
# Podman settings that work without a daemon on hosts whose root lacks
# CAP_SYS_RESOURCE (runc, explicit ulimits) are in deploy/image/containers.conf;
# CONTAINERS_CONF points there unless it is set.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
tag="fleetscope:$version"
binary=""
local_base=false
base=""

while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --local-base) local_base=true; shift ;;
    --base) base="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

for tool in podman buildah; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: $tool is not installed (Debian: apt-get install podman buildah runc)" >&2
    exit 1
  }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The runtime base made from this machine's files: what distroless cc holds that
# fleetscope needs, and nothing else (no shell, no package manager).
make_local_base() {
  local bin="$1" name="localhost/fleetscope-base:local" root="$work/base"
  mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
  chmod 1777 "$root/tmp"
  chown 65532:65532 "$root/home/nonroot"
  # The dynamic loader and every library the binary links, at the same paths.
  ldd "$bin" | awk '/=>/ { print $3 } /^[[:space:]]*\// { print $1 }' | sort -u |
    while read -r lib; do
      [ -e "$lib" ] || continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  local ctr
  ctr="$(buildah from scratch)"
  # A tar keeps the owners and modes (/tmp 1777, the nonroot home).
  tar -C "$root" --numeric-owner -cf "$work/base.tar" .
  buildah add --quiet "$ctr" "$work/base.tar" / >/dev/null
  buildah config --user 65532:65532 --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "$ctr"
  buildah commit --quiet --rm "$ctr" "$name" >/dev/null
  echo "$name"
}

args=(build --file "$repo/Containerfile" --tag "$tag")
if [ -n "$binary" ]; then
  [ -x "$binary" ] || { echo "build.sh: $binary is not an executable file" >&2; exit 1; }
  mkdir -p "$work/context/data"
  objcopy --strip-debug "$binary" "$work/context/fleetscope"
  args+=(--build-arg BINARY=prebuilt)
  context="$work/context"
else
  context="$repo"
  # The context holds no .git: the commit is given to the build.
  if commit="$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null)"; then
    args+=(--build-arg "FLEETSCOPE_COMMIT=$commit")
  fi
fi
if $local_base; then
  [ -n "$binary" ] || { echo "build.sh: --local-base needs --binary (its libraries)" >&2; exit 2; }
  base="$(make_local_base "$binary")"
fi
if [ -n "$base" ]; then
  args+=(--build-arg "BASE=$base")
fi
if [ -n "$binary" ] && [[ "$base" == localhost/* ]]; then
  args+=(--pull=never)
fi

start=$SECONDS
podman "${args[@]}" "$context"
size="$(podman image inspect --format '{{.Size}}' "$tag")"
echo "built $tag: $((size / 1000000)) MB in $((SECONDS - start)) s"
