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
V=${FAIRSEQ_VENV:-$HOME/.cache/nmt-peers/fairseq-venv}
W=${WORK:-$HOME/.cache/nmt-peers/work}
data=$root/data/multi30k
if [ ! -x "$V/bin/fairseq-train" ] || [ ! -f "$W/bin/dict.en.txt" ]; then
  echo "peer_quality: no fairseq build in $V or data in $W/bin; run ../shared/peers/fairseq_speed.sh first" >&2
  exit 2
fi
if [ ! -f "$data/test_2016_flickr.en" ]; then
  echo "peer_quality: $data/test_2016_flickr.en is missing; run make multi30k-data first" >&2
  exit 2
fi
threads=${THREADS:-$(nproc)}
ckpt=$W/ckpt_quality_$minutes
rm -rf "$ckpt"
cd "$W"
start=$(date +%s)
OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads "$V/bin/fairseq-train" bin --arch transformer \
  --encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3 --encoder-attention-heads 4 \
  --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-layers 3 --decoder-attention-heads 4 \
  --encoder-normalize-before --decoder-normalize-before --share-all-embeddings --dropout 0.1 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 300 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --clip-norm 1.0 --cpu \
  --log-interval 50 --log-format simple --stop-time-hours "$(python3 -c "print($minutes / 60)")" \
  --save-dir "$ckpt" --no-epoch-checkpoints --seed 1 >"train_quality_$minutes.log" 2>&1
echo "fairseq trained for $(( $(date +%s) - start )) s: $(grep -c '| valid on' "train_quality_$minutes.log") validations," \
  "$(grep -o 'num_updates [0-9]*' "train_quality_$minutes.log" | tail -1)"
# fairseq's checkpoints hold pickled objects: torch's weights-only loading refuses them without this.
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 OMP_NUM_THREADS=$threads "$V/bin/fairseq-generate" bin \
  --path "$ckpt/checkpoint_best.pt" --gen-subset test --beam 5 --batch-size 128 \
  --post-process sentencepiece --cpu >"generate_quality_$minutes.out" 2>/dev/null
grep '^D-' "generate_quality_$minutes.out" | sed 's/^D-//' | sort -n | cut -f3 >"fairseq_quality_$minutes.hyp"
echo "fairseq $minutes min, test_2016_flickr beam 5: BLEU $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" \
  -i "fairseq_quality_$minutes.hyp" -m bleu -b) chrF $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" \
  -i "fairseq_quality_$minutes.hyp" -m chrf -b)"
