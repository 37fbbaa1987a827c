#!/usr/bin/env bash
# The recorded run: every benchmark once, one after the other, against a snapshot of a commit
# (default HEAD) so work in progress in the checkout does not leak in. Markdown and JSON land in
# benchmarks/results/. About 18 minutes on a 2-core machine (+ ~2 min for distributed_steps, ~1.5 min for
# exchange_cost).
# One benchmark alone: benchmarks/run_all.sh REV step_overhead
#   benchmarks/run_all.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
snap=/tmp/graphsync-bench-$(git rev-parse --short "$rev")
benchmarks/snapshot.sh "$rev" "$snap"
mkdir -p benchmarks/results
shift || true
for b in ${@:-accuracy rule_accuracy traffic step_overhead step_work rewrite_cost cli_end_to_end distributed_steps exchange_cost run_overhead}; do
  echo "== $b" >&2
  script=$b extra=()
  [ "$b" = rewrite_cost ] && extra=(--profile 4)
  [ "$b" = step_overhead ] && extra=(--op-types)
  # step_work: the same models with one inter-op thread, i.e. the compute a synchronized step adds
  [ "$b" = step_work ] && script=step_overhead extra=(--inter-op 1 --rounds 9 --variants unsynced graphsync graphsync-allreduce)
  GRAPHSYNC_SRC=$snap /usr/bin/time -f "$b: %e s wall" python benchmarks/$script.py "${extra[@]}" \
    --json benchmarks/results/$b.json > benchmarks/results/$b.md
done
