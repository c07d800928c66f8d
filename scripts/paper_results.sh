#!/usr/bin/env bash
# Regenerate the README's results table: every paper workload in the simulator (seed 42, one
# 10,000-token replica unless noted), then one combined table. `bash scripts/paper_results.sh [OUT]`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="${1:-out/paper}"
trace="loadgen/data/arena_trace_lengths.csv"
run() { .venv/bin/fairgate simulate --no-plots --no-progress --seed 42 "$@" >/dev/null; }
three=(--policy vtc --policy fcfs --policy lcf)
for w in overload proportional on_off_less on_off_overload poisson_short_long poisson_short_long_2 increase \
  dist_shift overload_multi overload_weighted; do
  run --workload "$w" "${three[@]}" --out "$out/$w" &
done
run --workload ablation --policy vtc --policy fcfs --out "$out/ablation" &
wait
run --workload real --trace "$trace" "${three[@]}" --policy rpm:5 --policy vtc-predict --policy vtc-oracle:0.5 \
  --out "$out/real" &
run --workload overload --rate-scale 4 --replicas 4 --policy vtc --policy fcfs --out "$out/overload-x4" &
wait
reports=()
for w in overload proportional on_off_less on_off_overload poisson_short_long poisson_short_long_2 increase \
  dist_shift overload_multi overload_weighted ablation real overload-x4; do
  reports+=("$out/$w/report.json")
done
.venv/bin/python -m fairgate.loadgen.report "${reports[@]}" | tee "$out/table.txt"
