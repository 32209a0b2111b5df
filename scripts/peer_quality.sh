#!/usr/bin/env bash
# fairseq 0.12's quality for time on Multi30k de->en: trains the benchmark recipe of
# ../shared/peers/fairseq_speed.sh (same architecture, data, SentencePiece model, batch size) for a
# wall-clock budget, then translates test_2016_flickr with its best checkpoint by dev loss (beam 5)
# and prints sacreBLEU's BLEU and chrF. The target nmt's recipe must reach in half the time.
#
# usage: scripts/peer_quality.sh [MINUTES]     (default 30)
# env:   FAIRSEQ_VENV, WORK   as in ../shared/peers/fairseq_speed.sh (run that once first)
#        THREADS              torch threads (default: all cores)
set -euo pipefail
minutes=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/fairseq_peer.sh"
require_peer peer_quality
threads=${THREADS:-$(nproc)}
ckpt=$W/ckpt_quality_$minutes
rm -rf "$ckpt"
cd "$W"
start=$(date +%s)
OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads "$V/bin/fairseq-train" bin "${FAIRSEQ_RECIPE[@]}" \
  --stop-time-hours "$(python3 -c "print($minutes / 60)")" --save-dir "$ckpt" --no-epoch-checkpoints \
  >"train_quality_$minutes.log" 2>&1
echo "fairseq trained for $(( $(date +%s) - start )) s: $(grep -c '| valid on' "train_quality_$minutes.log") validations," \
  "$(grep -o 'num_updates [0-9]*' "train_quality_$minutes.log" | tail -1)"
# fairseq's checkpoints hold pickled objects: torch's weights-only loading refuses them without this.
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 OMP_NUM_THREADS=$threads "$V/bin/fairseq-generate" bin \
  --path "$ckpt/checkpoint_best.pt" --gen-subset test --beam 5 --batch-size 128 \
  --post-process sentencepiece --cpu >"generate_quality_$minutes.out" 2>/dev/null
fairseq_hypotheses "generate_quality_$minutes.out" >"fairseq_quality_$minutes.hyp"
echo "fairseq $minutes min, test_2016_flickr beam 5: BLEU $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" \
  -i "fairseq_quality_$minutes.hyp" -m bleu -b) chrF $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" \
  -i "fairseq_quality_$minutes.hyp" -m chrf -b)"
