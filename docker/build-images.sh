#!/usr/bin/env bash
# Build packtrain's images daemonlessly with podman (buildah underneath): `make images` runs this.
#   docker/build-images.sh [cpu] [gpu] [base]   (default: cpu gpu; `make images IMAGES=cpu` the same; base: only step 2)
#
# What it does, in order:
#  1. podman (+ buildah, runc) from Debian packages: installed with apt-get when missing and run as root;
#     otherwise a clear error naming the package. CONTAINERS_CONF defaults to docker/podman/containers.conf
#     (runc, cgroupfs, file events: what works on hosts with hybrid cgroups).
#  2. The Python base: the Dockerfiles' public base (python:3.11-slim-bookworm) when it is present or can be
#     pulled; otherwise a local stand-in, localhost/packtrain-python:3.11-bookworm, made once with
#     `debootstrap --variant=minbase bookworm` plus Debian's python3/venv/pip (no registry needed).
#  3. The GPU image's base: nvidia/cuda (the Dockerfile's default) when it can be pulled, else the same Python base
#     (PyPI's CUDA torch wheels carry the CUDA runtime as nvidia-* wheels; the driver comes from the host).
#  4. `podman build` of docker/Dockerfile.cpu and docker/Dockerfile with the host's CA bundle as a build secret
#     (id=ca: pip's certificate store in the RUN steps that download, never written to a layer) and the git sha
#     as the revision label. CPU torch comes from TORCH_WHEELS (a folder holding the CPU torch wheel, mounted
#     read-only into the build) when it has one, else from the CPU torch index.
# Environment: IMAGES, CA_BUNDLE, TORCH_WHEELS, PYTHON_IMAGE, CUDA_IMAGE, DEBIAN_MIRROR, PULL_TIMEOUT (s), GIT_SHA
# (default: the checkout's, -dirty when src/, components/, pipelines/, recipes/ or pyproject.toml have changes).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "make images: $*" >&2; }
die() { say "$*"; exit 1; }

export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/docker/podman/containers.conf}"
IMAGES="${*:-${IMAGES:-cpu gpu}}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
TORCH_WHEELS="${TORCH_WHEELS:-/opt/wheels}"
PUBLIC_PYTHON="docker.io/library/python:3.11-slim-bookworm"
PUBLIC_CUDA="docker.io/nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
LOCAL_PYTHON="localhost/packtrain-python:3.11-bookworm"
PULL_TIMEOUT="${PULL_TIMEOUT:-60}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
if [ -z "${GIT_SHA:-}" ]; then
  GIT_SHA="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  if [ "$GIT_SHA" != unknown ] && [ -n "$(git status --porcelain -- src components pipelines recipes pyproject.toml 2>/dev/null)" ]; then
    GIT_SHA="${GIT_SHA}-dirty"
  fi
fi

for which in $IMAGES; do
  case "$which" in cpu|gpu|base) ;; *) die "unknown image '$which': choose cpu, gpu and/or base";; esac
done

apt_install() {  # apt_install PACKAGE...: as root with apt-get, `apt-get update` only when a package is unknown
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "$* not installed and this is not root with apt-get: install them (Debian/Ubuntu: sudo apt-get install -y $*)"
  fi
  export DEBIAN_FRONTEND=noninteractive
  for p in "$@"; do apt-cache show "$p" >/dev/null 2>&1 || { apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null; break; }; done
  say "installing $* (apt-get)"
  apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "$@" >/dev/null \
    || die "apt-get install $* failed"
}

need=()
command -v podman >/dev/null || need+=(podman)
command -v buildah >/dev/null || need+=(buildah)
command -v runc >/dev/null || need+=(runc)
[ "${#need[@]}" = 0 ] || apt_install "${need[@]}"

secret_args=()
if [ -s "$CA_BUNDLE" ]; then
  secret_args=(--secret "id=ca,src=$CA_BUNDLE")
else
  say "no CA bundle at $CA_BUNDLE: pip uses the base image's certificates (set CA_BUNDLE=FILE behind a TLS proxy)"
fi

try_pull() {  # try_pull IMAGE: present, or pulled within PULL_TIMEOUT seconds
  podman image exists "$1" && return 0
  say "pulling $1 (up to ${PULL_TIMEOUT}s)"
  timeout "$PULL_TIMEOUT" podman pull -q "$1" >/dev/null 2>&1
}

debian_mirror() {  # the host's Debian mirror (deb822 or one-line sources), else deb.debian.org
  local m=""
  m="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)" || true
  [ -n "$m" ] || m="$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) bookworm .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)" || true
  echo "${DEBIAN_MIRROR:-${m:-http://deb.debian.org/debian}}"
}

local_python_base() {  # localhost/packtrain-python:3.11-bookworm from debootstrap (once; ~2-3 min, ~200 MB)
  podman image exists "$LOCAL_PYTHON" && return 0
  command -v debootstrap >/dev/null || apt_install debootstrap
  local rootfs mirror
  mirror="$(debian_mirror)"
  rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/packtrain-rootfs.XXXXXX")"
  trap 'rm -rf "$rootfs"' EXIT
  say "no registry: building $LOCAL_PYTHON with debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; die "debootstrap failed (log above)"; }
  rm -f "$rootfs.log"
  ln -sf python3 "$rootfs/usr/bin/python"
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import -q \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase bookworm + python3 (stand-in for $PUBLIC_PYTHON)" - "$LOCAL_PYTHON" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
}

if [ -n "${PYTHON_IMAGE:-}" ]; then
  podman image exists "$PYTHON_IMAGE" || try_pull "$PYTHON_IMAGE" || die "PYTHON_IMAGE=$PYTHON_IMAGE is neither local nor pullable"
elif try_pull "$PUBLIC_PYTHON"; then
  PYTHON_IMAGE="$PUBLIC_PYTHON"
else
  local_python_base
  PYTHON_IMAGE="$LOCAL_PYTHON"
fi
say "Python base: $PYTHON_IMAGE"

# The sha also as --label/--env: buildah 1.28 keys its layer cache on the LABEL/ENV text, not the ARG values in
# it, so a cached `LABEL revision="${GIT_SHA}"` would keep an older commit's sha; these apply at commit time.
build() {  # build DOCKERFILE TAG ARG...
  local dockerfile="$1" tag="$2" start; shift 2
  start=$(date +%s)
  say "building $tag from $dockerfile (git $GIT_SHA)"
  podman build --layers -f "$dockerfile" -t "$tag" \
    "${secret_args[@]}" \
    --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" \
    --build-arg "PACKTRAIN_VERSION=$VERSION" --build-arg "GIT_SHA=$GIT_SHA" \
    --label "org.opencontainers.image.revision=$GIT_SHA" --label "org.opencontainers.image.version=$VERSION" \
    --env "PACKTRAIN_CODE_VERSION=$VERSION+g$GIT_SHA" \
    "$@" . || die "podman build of $dockerfile failed (output above)"
  say "$tag built in $(( $(date +%s) - start )) s: $(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
}

image_of() { awk -v f="$1" '$2 == f {print $1}' docker/registry.txt; }

for which in $IMAGES; do
  if [ "$which" = base ]; then
    continue
  elif [ "$which" = cpu ]; then
    wheel_args=()
    if compgen -G "$TORCH_WHEELS/torch-*+cpu-*.whl" >/dev/null; then
      wheel_args=(-v "$TORCH_WHEELS:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels)
      say "CPU torch from $TORCH_WHEELS (read-only mount)"
    fi
    build docker/Dockerfile.cpu "$(image_of docker/Dockerfile.cpu)" "${wheel_args[@]}"
  else
    if [ -n "${CUDA_IMAGE:-}" ]; then
      podman image exists "$CUDA_IMAGE" || try_pull "$CUDA_IMAGE" || die "CUDA_IMAGE=$CUDA_IMAGE is neither local nor pullable"
      cuda_args=(--build-arg "CUDA_IMAGE=$CUDA_IMAGE")
    elif try_pull "$PUBLIC_CUDA"; then
      cuda_args=(--build-arg "CUDA_IMAGE=$PUBLIC_CUDA")
    else
      say "nvidia/cuda cannot be pulled: GPU image on $PYTHON_IMAGE with PyPI's CUDA torch (no nvcc: DeepSpeed ops that JIT-build need the devel base)"
      cuda_args=(--build-arg "CUDA_IMAGE=$PYTHON_IMAGE" --build-arg "TORCH_INDEX=https://pypi.org/simple")
    fi
    build docker/Dockerfile "$(image_of docker/Dockerfile)" "${cuda_args[@]}"
  fi
done
