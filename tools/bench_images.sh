#!/usr/bin/env bash
# Build times and sizes of the images (bench/results/images.json's cpu_image section):
#   bash tools/bench_images.sh [OUT.json]      (as root; ~15 min on 2 cores; IMAGES=cpu by default)
# Runs on a copy of HEAD (git archive) in its own podman storage (a fresh graphroot), so nothing cached from
# earlier builds helps the cold number and the checkout is never edited:
#   cold        docker/build-images.sh from an empty store (the Python base included when no registry answers)
#   warm        the same again, nothing changed
#   src change  one line appended to a module under src/ (a new wheel), then the build
# Each image's size is what `podman image inspect` reports.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${TMPDIR:-/tmp}/images_bench.json}"
IMAGES="${IMAGES:-cpu}"
work="$(mktemp -d "${TMPDIR:-/var/tmp}/packtrain-bench-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tree" "$work/store" "$work/run"
git archive HEAD | tar -x -C "$work/tree"
sha="$(git rev-parse --short=12 HEAD)"
printf '[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "%s"\n' "$work/store" "$work/run" > "$work/storage.conf"
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
export CONTAINERS_CONF="$PWD/docker/podman/containers.conf"

build() {  # build LABEL [GIT_SHA]: seconds of one docker/build-images.sh run in the copy
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$work/tree" && GIT_SHA="${2:-$sha}" bash docker/build-images.sh $IMAGES) >"$work/$1.log" 2>&1 \
    || { tail -30 "$work/$1.log" >&2; echo "bench_images: $1 build failed" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(round($t1 - $t0, 1))"
}

cold=$(build cold)
warm=$(build warm)
echo "# bench_images: a changed line" >> "$work/tree/src/packtrain/__init__.py"
src=$(build src-change "$sha-dirty")
sizes="$(for which in $IMAGES; do
  f=docker/Dockerfile; [ "$which" = cpu ] && f=docker/Dockerfile.cpu
  img="$(awk -v f="$f" '$2 == f {print $1}' docker/registry.txt)"
  echo "\"$img\": $(podman image inspect --format '{{.Size}}' "$img")"
done | paste -sd, -)"
base="$(podman image inspect --format '{{.Size}}' localhost/packtrain-python:3.11-bookworm 2>/dev/null || echo null)"
cat > "$OUT.tmp" <<EOF
{
  "what": "docker/build-images.sh ($IMAGES): cold (empty podman store), warm (unchanged), after a one-line change under src/",
  "command": "bash tools/bench_images.sh $OUT",
  "git_sha": "$sha",
  "machine": "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end (a shared machine)",
  "podman": "$(podman --version | awk '{print $3}')",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "seconds": {"cold": $cold, "warm": $warm, "src_change": $src},
  "bytes": {$sizes, "localhost/packtrain-python:3.11-bookworm": $base}
}
EOF
mv "$OUT.tmp" "$OUT"
cat "$OUT"
