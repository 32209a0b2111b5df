# Shared by scripts/peer_decode.sh and scripts/peer_quality.sh (sourced, not run): where
# ../shared/peers/fairseq_speed.sh built fairseq 0.12 and its binarized data, and the benchmark
# recipe both train, so that the two comparisons always train the same peer.
# Needs $root (the repository) set by the caller.
V=${FAIRSEQ_VENV:-$HOME/.cache/nmt-peers/fairseq-venv}
W=${WORK:-$HOME/.cache/nmt-peers/work}
data=$root/data/multi30k
# nmt's CLI bounds how long idle OpenMP threads spin (nmt/openmp.py); fairseq gets the same bound,
# unless the user chose one, since its default 30x longer spin costs it alone on shared cores.
if [ -z "${GOMP_SPINCOUNT+set}" ] && [ -z "${OMP_WAIT_POLICY+set}" ]; then
  export GOMP_SPINCOUNT=10000
fi

# require_peer NAME: exit 2 with one line unless fairseq, its data and Multi30k's test set are here.
require_peer() {
  if [ ! -x "$V/bin/fairseq-train" ] || [ ! -f "$W/bin/dict.en.txt" ]; then
    echo "$1: no fairseq build in $V or data in $W/bin; run ../shared/peers/fairseq_speed.sh first" >&2
    exit 2
  fi
  if [ ! -f "$data/test_2016_flickr.de" ] || [ ! -f "$data/test_2016_flickr.en" ]; then
    echo "$1: $data/test_2016_flickr.{de,en} is missing; run make multi30k-data first" >&2
    exit 2
  fi
}

# The benchmark architecture and recipe (configs/multi30k_transformer.yaml's, as fairseq_speed.sh).
FAIRSEQ_RECIPE=(
  --arch transformer
  --encoder-embed-dim 256 --encoder-ffn-embed-dim 1024 --encoder-layers 3 --encoder-attention-heads 4
  --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-layers 3 --decoder-attention-heads 4
  --encoder-normalize-before --decoder-normalize-before --share-all-embeddings --dropout 0.1
  --optimizer adam --adam-betas '(0.9,0.98)' --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 300
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --clip-norm 1.0 --cpu
  --log-interval 50 --log-format simple --seed 1
)

# fairseq_hypotheses OUT: fairseq-generate's output file -> detokenized hypotheses in input order.
fairseq_hypotheses() {
  grep '^D-' "$1" | sed 's/^D-//' | sort -n | cut -f3
}

# nmt_kernels LOG: the kernels nmt train chose, as its log's first 'auto:' or 'kernels:' line states
# them ("precision fp32, fp32 matmul onednn, attention sdpa, 1 thread"), less the figures behind them.
nmt_kernels() {
  grep -m1 -E '^(auto|kernels): precision ' "$1" | sed -E 's/^(auto|kernels): //; s/ \(.*//'
}
