#!/usr/bin/env bash
# Beam-5 decoding of Multi30k test_2016_flickr: nmt against fairseq-generate, same machine, one sitting.
#
# Trains fairseq 0.12 (the venv and binarized data that ../shared/peers/fairseq_speed.sh builds)
# and nmt (configs/multi30k_transformer.yaml) for the same number of updates with the same recipe,
# so that both decode models of similar quality (an undertrained model's long outputs would
# distort the timing), then times the whole translate command of each, twice, and scores both.
#
# usage: scripts/peer_decode.sh [UPDATES]     (default 500; about 10 + 5 minutes of training on 2 cores)
#        the models stay, in $WORK/ckpt_decode_UPDATES and runs/peer_decode_nmt_UPDATES, for the next sitting;
#        a training interrupted in an earlier sitting (its log lacks its closing line) is resumed to UPDATES
# env:   FAIRSEQ_VENV, WORK  as in ../shared/peers/fairseq_speed.sh (run that once first)
#        NMT                 the nmt command (default .venv/bin/nmt)
set -euo pipefail
updates=${1:-500}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/fairseq_peer.sh"
require_peer peer_decode
NMT=${NMT:-$root/.venv/bin/nmt}
# One pair of models per update count: those trained for another count are kept, never reused for this one.
run=$root/runs/peer_decode_nmt_$updates
ckpt=ckpt_decode_$updates
fairseq_log=train_decode_$updates.log
cd "$W"
# A checkpoint alone is no finished model: an interrupted training leaves one too. Each is finished
# when its log ends on the line its trainer closes a completed run with; any other is trained again,
# and both trainers resume from the checkpoint in their directory. The logs are appended to.
if ! tail -n 1 "$fairseq_log" 2>/dev/null | grep -q 'done training in'; then
  "$V/bin/fairseq-train" bin "${FAIRSEQ_RECIPE[@]}" --max-update "$updates" --save-dir "$ckpt" \
    --no-epoch-checkpoints --disable-validation >>"$fairseq_log" 2>&1
fi
# nmt/training.py:run's closing line, after its timestamp (as scripts/recipe_search.py checks it)
if ! tail -n 1 "$run/train.log" 2>/dev/null | grep -qE '^[0-9-]+ [0-9:]+ best dev BLEU .*; run directory '; then
  (cd "$root" && "$NMT" train --config "$root/configs/multi30k_transformer.yaml" --set run_dir="$run" \
    --set train.max_updates="$updates" --set train.max_minutes=null --set train.validate_every="$updates" \
    >/dev/null)
fi
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
for attempt in 1 2; do
  # fairseq's checkpoints hold pickled objects: torch's weights-only loading refuses them without this.
  start=$(now)
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$V/bin/fairseq-generate" bin --path "$ckpt/checkpoint_last.pt" \
    --gen-subset test --beam 5 --batch-size 128 --post-process sentencepiece --cpu >generate.out 2>generate.err
  echo "fairseq-generate, beam 5, whole command: $(since "$start") s (run $attempt)"
  start=$(now)
  "$NMT" translate --model "$run" -i "$data/test_2016_flickr.de" -o "$W/nmt.hyp" --beam-size 5 2>translate.err
  echo "nmt translate,    beam 5, whole command: $(since "$start") s (run $attempt)"
done
grep -o 'Translated .*' generate.err || true
fairseq_hypotheses generate.out >fairseq.hyp
echo "fairseq: $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" -i fairseq.hyp -m bleu -b)  nmt: $("$V/bin/sacrebleu" "$data/test_2016_flickr.en" -i nmt.hyp -m bleu -b)  (test_2016_flickr BLEU after $updates updates)"
