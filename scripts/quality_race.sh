#!/usr/bin/env bash
# Quality for time against fairseq, side by side on one machine, one thread each: fairseq 0.12
# trains its benchmark recipe for 2 x MINUTES (scripts/peer_quality.sh) on one core while nmt trains
# configs/multi30k_transformer.yaml for MINUTES on the other, first as on a CPU without bf16 units
# (ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI: oneDNN emulates bf16, so `auto` measures fp32 faster), then
# natively. Each system's test_2016_flickr score (beam 5) comes from its own dev-chosen checkpoint;
# nothing here is chosen on test.
#
# usage: scripts/quality_race.sh [MINUTES]     (default 15: nmt's 15 minutes against fairseq's 30)
# env:   FAIRSEQ_VENV, WORK   as in ../shared/peers/fairseq_speed.sh (run that once first)
#        OUT                  nmt's run directories (default runs/race)
set -euo pipefail
minutes=${1:-15}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/fairseq_peer.sh"
# One CPU each: the first two this process may run on (a container's cpuset or a taskset may leave
# out CPUs 0 and 1, and taskset then refuses them).
read -r cpu_peer cpu_nmt < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
if [ -z "${cpu_nmt:-}" ]; then
  echo "quality_race: needs two CPUs, one per trainer; this process may run on CPU $cpu_peer only" >&2
  exit 2
fi
require_peer quality_race
out=${OUT:-$root/runs/race}
nmt=$root/.venv/bin/nmt
[ -x "$nmt" ] || nmt=nmt
mkdir -p "$out"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "CPU: $cpu, $(nproc) cores; fairseq $((2 * minutes)) min (CPU $cpu_peer) and nmt $minutes min + $minutes min" \
  "(CPU $cpu_nmt), one thread each"

THREADS=1 taskset -c "$cpu_peer" "$root/scripts/peer_quality.sh" $((2 * minutes)) >"$out/fairseq.txt" 2>&1 &
peer=$!

race() {  # race NAME [ENV=VALUE ...]: train on CPU $cpu_nmt for $minutes, then score test_2016_flickr
  local name=$1 run=$out/$1
  shift
  rm -rf "$run"
  env "$@" taskset -c "$cpu_nmt" "$nmt" train --config "$root/configs/multi30k_transformer.yaml" \
    --set run_dir="$run" --set train.threads=1 --set train.max_minutes="$minutes" \
    --set train.max_updates=null \
    >"$out/$name.log" 2>&1
  env "$@" taskset -c "$cpu_nmt" "$nmt" eval-bleu --model "$run" --src "$data/test_2016_flickr.de" \
    --ref "$data/test_2016_flickr.en" --output "$run/test.hyp" >"$out/$name.test.txt" 2>&1
  echo "nmt $name, $minutes min: $(nmt_kernels "$out/$name.log");" \
    "last logged $(grep -o "^update [0-9]*" "$out/$name.log" | tail -1); $(grep 'best dev BLEU' "$out/$name.log")"
  echo "  test_2016_flickr: $(grep -E 'BLEU|chrF' "$out/$name.test.txt" | tr '\n' ' ')"
}
race no-bf16-units ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI
race native
wait "$peer"
cat "$out/fairseq.txt"
