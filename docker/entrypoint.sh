#!/bin/sh
# packtrain images' entrypoint: the working directory (the mounted workspace, or the pipeline root a component
# writes) must be writable by the user the container runs as; then the command runs (exec, so its exit code is
# the container's).
#   - the image's user (uid 1000) with a mount it cannot write: a clear error naming the directory, its owner and
#     the two fixes (run as the owner: --user UID:GID — any uid works, HOME is writable by all; or chown it);
#   - started as root (--user 0): drops to the directory's owner when that is not root (files come out owned as
#     the mount); a root-owned directory keeps root, which rootless podman maps to the invoking user.
# Kubernetes pods name their command, so this entrypoint does not run there (fsGroup makes volumes writable).
set -e
dir="${PACKTRAIN_WRITABLE_DIR:-$PWD}"
uid="$(id -u)"
if [ "$uid" = 0 ] && [ -z "${PACKTRAIN_KEEP_ROOT:-}" ]; then
  owner="$(stat -c %u "$dir")"
  if [ "$owner" != 0 ]; then
    exec setpriv --reuid="$owner" --regid="$(stat -c %g "$dir")" --clear-groups \
      "$0" "$@"
  fi
elif [ ! -w "$dir" ]; then
  echo "packtrain image: $dir (owner $(stat -c %u:%g "$dir"), mode $(stat -c %a "$dir")) is not writable by uid $uid." >&2
  echo "  fix: run the container as the directory's owner (--user $(stat -c %u:%g "$dir")), or make it writable" >&2
  echo "  for uid $uid on the host (chown $uid:$(id -g) DIR)." >&2
  exit 73
fi
[ -w "${HOME:-/nonexistent}" ] || export HOME=/tmp
exec "$@"
