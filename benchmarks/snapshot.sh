#!/usr/bin/env bash
# Extracts graphsync/ (and cli/) of a commit into DIR, so benchmarks measure that commit:
#   benchmarks/snapshot.sh HEAD /tmp/graphsync-HEAD && GRAPHSYNC_SRC=/tmp/graphsync-HEAD python benchmarks/...
set -euo pipefail
rev=${1:-HEAD}; dir=${2:-/tmp/graphsync-snapshot}
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$dir" && mkdir -p "$dir"
git -C "$top" archive "$rev" graphsync cli | tar -x -C "$dir"
git -C "$top" rev-parse --short "$rev" > "$dir/COMMIT"
echo "$dir: graphsync at $(cat "$dir/COMMIT")"
