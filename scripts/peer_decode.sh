#!/usr/bin/env bash
# Beam-5 decoding of Multi30k test_2016_flickr: nmt against fairseq-generate, same machine, one sitting.
#
# Trains fairseq 0.12 (the venv and binarized data that ../shared/peers/fairseq_speed.sh builds)
# and nmt (configs/multi30k_transformer.yaml) for the same number of updates with the same recipe,
# so that both decode models of similar quality (an undertrained model's long outputs would
# distort the timing), then times the whole translate command of each, twice, and scores both.
#
# usage: scripts/peer_decode.sh [UPDATES]     (default 500; about 10 + 5 minutes of training on 2 cores)
# env:   FAIRSEQ_VENV, WORK  as in ../shared/peers/fairseq_speed.sh (run that once first)
#        NMT                 the nmt command (default .venv/bin/nmt)
set -euo pipefail
updates=${1:-500}
root=$(cd "$(dirname "$0")/.." && pwd)
V=${FAIRSEQ_VENV:-$HOME/.cache/nmt-peers/fairseq-venv}
W=${WORK:-$HOME/.cache/nmt-peers/work}
NMT=${NMT:-$root/.venv/bin/nmt}
data=$root/data/multi30k
run=$root/runs/peer_decode_nmt
if [ ! -x "$V/bin/fairseq-train" ] || [ ! -f "$W/bin/dict.en.txt" ]; then
  echo "peer_decode: no fairseq build in $V or data in $W/bin; run ../shared/peers/fairseq_speed.sh first" >&2
  exit 2
fi
if [ ! -f "$data/test_2016_flickr.de" ]; then
  echo "peer_decode: $data/test_2016_flickr.de is missing; run make multi30k-data first" >&2
  exit 2
fi
cd "$W"
if [ ! -f "ckpt_decode/checkpoint_last.pt" ]; then
  "$V/bin/fairseq-train" bin --arch transformer \
    --encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3 --encoder-attention-heads 4 \
    --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-layers 3 --decoder-attention-heads 4 \
    --encoder-normalize-before --decoder-normalize-before --share-all-embeddings --dropout 0.1 \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 300 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --clip-norm 1.0 --cpu \
    --log-interval 50 --log-format simple --max-update "$updates" --save-dir ckpt_decode \
    --no-epoch-checkpoints --disable-validation --seed 1 >train_decode.log 2>&1
fi
if [ ! -f "$run/checkpoints/index.json" ]; then
  rm -rf "$run"
  (cd "$root" && "$NMT" train --config "$root/configs/multi30k_transformer.yaml" --set run_dir="$run" \
    --set train.max_updates="$updates" --set train.max_minutes=null --set train.validate_every="$updates" \
    >/dev/null)
fi
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
for attempt in 1 2; do
  # fairseq's checkpoints hold pickled objects: torch's weights-only loading refuses them without this.
  start=$(now)
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$V/bin/fairseq-generate" bin --path ckpt_decode/checkpoint_last.pt \
    --gen-subset test --beam 5 --batch-size 128 --post-process sentencepiece --cpu >generate.out 2>generate.err
  echo "fairseq-generate, beam 5, whole command: $(since "$start") s (run $attempt)"
  start=$(now)
  "$NMT" translate --model "$run" -i "$data/test_2016_flickr.de" -o "$W/nmt.hyp" --beam-size 5 2>translate.err
  echo "nmt translate,    beam 5, whole command: $(since "$start") s (run $attempt)"
done
grep -o 'Translated .*' generate.err || true
grep '^D-' generate.out | sed 's/^D-//' | sort -n | cut -f3 >fairseq.hyp
echo "fairseq: $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" -i fairseq.hyp -m bleu -b)  nmt: $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" -i nmt.hyp -m bleu -b)  (test_2016_flickr BLEU after $updates updates)"
