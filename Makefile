# Set-up and everyday commands. Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch (on this machine's disk); a GPU user may set TORCH_SPEC='torch>=2.4.1'.
TORCH_SPEC ?= torch==2.13.0
# scripts/get_multi30k.py copies Multi30k from MULTI30K_DIR when it is set, and downloads it
# otherwise. The default is ../shared/data/multi30k where that directory exists (this project's
# machines), and empty elsewhere, so that a fresh clone downloads.
SHARED_MULTI30K := $(abspath ../shared/data/multi30k)
MULTI30K_DIR ?= $(if $(wildcard $(SHARED_MULTI30K)/train.de $(SHARED_MULTI30K)/train.de.gz),$(SHARED_MULTI30K))
export MULTI30K_DIR
# Threads of each Multi30k training (auto: measured); `make -j2 compare THREADS=1` trains two at once,
# one per core, as the README's Transformer-vs-LSTM table was measured.
THREADS ?= auto

.PHONY: help install demo test lint multi30k-data multi30k multi30k-best multi30k-rnn multi30k-shared multi30k-rnn-shared bench bench-scale compare gpu-check clean

help:
	@echo "make install        the virtual environment .venv with nmt and its extras (the other targets do it first)"
	@echo "make demo           train + translate + score the offline synthetic demo (< 5 min on 2 CPU cores)"
	@echo "make test           run the test suite"
	@echo "make lint           ruff"
	@echo "make multi30k       Multi30k de->en Transformer: fetch data, train 30 min, tune decoding on dev, score test"
	@echo "make multi30k-best  the best Multi30k recipe: train 130 min, tune decoding on dev, score test"
	@echo "make multi30k-rnn   the LSTM+attention baseline, its own recipe, same data and budget"
	@echo "make multi30k-data  fetch Multi30k into data/multi30k (copied from MULTI30K_DIR where it is set)"
	@echo "make multi30k-shared, multi30k-rnn-shared"
	@echo "                    each model with the peers' shared recipe (the half of make compare)"
	@echo "make compare        both models, each with its own recipe and with the peers' shared one (4 runs"
	@echo "                    of 30 min): report/compare.md and report/compare.png"
	@echo "make bench          speed benchmark (training tokens/s, decoding sentences/s, vs. matmul peak)"
	@echo "make bench-scale    data at scale: prepare 100k and 5M generated pairs, training memory of both"
	@echo "make gpu-check      everything that needs CUDA, one screen of results (a Python whose torch sees a GPU,"
	@echo "                    or GPU_PY=python3; nothing is installed where one is found)"
	@echo "make clean          remove runs/ and data/demo (keeps .venv and data/multi30k)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev,report,tensorboard,export]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/nmt train --config configs/demo.yaml
	$(BIN)/nmt eval-bleu --model runs/demo --src data/demo/test.src --ref data/demo/test.trg --output runs/demo/test.hyp

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check nmt tests scripts

multi30k-data: install
	$(BIN)/python scripts/get_multi30k.py --out data/multi30k

# $(call train_tune_test,NAME): train configs/NAME.yaml into runs/NAME, choose beam size and length
# penalty on dev (written into the run's config), then translate the test set once with what dev chose.
define train_tune_test
	$(BIN)/nmt train --config configs/$(1).yaml --set train.threads=$(THREADS)
	$(BIN)/nmt tune-decode --model runs/$(1)
	$(BIN)/nmt eval-bleu --model runs/$(1) --src data/multi30k/test_2016_flickr.de \
		--ref data/multi30k/test_2016_flickr.en --output runs/$(1)/test.hyp
endef

multi30k: multi30k-data
	$(call train_tune_test,multi30k_transformer)

multi30k-best: multi30k-data
	$(call train_tune_test,multi30k_best)

multi30k-rnn: multi30k-data
	$(call train_tune_test,multi30k_rnn)

# The peers' benchmark recipe, which both models shared before each was tuned on dev: 4096-token
# batches, lr 1e-3, inverse square root, beam 5 with no length penalty.
PEER_RECIPE = --set train.max_tokens=4096 --set train.lr_peak=1e-3 --set train.schedule=inverse_sqrt \
	--set decode.beam_size=5 --set decode.length_penalty=1.0

# $(call train_peer_recipe,NAME): configs/NAME.yaml with the peers' recipe, into runs/NAME_shared.
define train_peer_recipe
	$(BIN)/nmt train --config configs/$(1).yaml --set train.threads=$(THREADS) $(PEER_RECIPE) \
		--set name=$(1)_shared --set run_dir=runs/$(1)_shared
endef

multi30k-shared: multi30k-data
	$(call train_peer_recipe,multi30k_transformer)

multi30k-rnn-shared: multi30k-data
	$(call train_peer_recipe,multi30k_rnn)

# Both models under the same 30-minute budget, each with its own recipe and with the shared one.
compare: multi30k multi30k-rnn multi30k-shared multi30k-rnn-shared
	$(BIN)/nmt compare runs/multi30k_transformer runs/multi30k_rnn runs/multi30k_transformer_shared \
		runs/multi30k_rnn_shared --out report

# Speed on the Multi30k config at the peers' batch size (fairseq_speed.sh's 4096 tokens; the config's
# recipe trains on 2048), so that the ratio compares like with like; decodes with the trained run
# when there is one. runs/ is made first: nmt bench refuses --json into a missing directory.
bench: multi30k-data
	mkdir -p runs
	$(BIN)/nmt bench --config configs/multi30k_transformer.yaml --set train.max_tokens=4096 --json runs/bench.json \
		$$([ -f runs/multi30k_transformer/checkpoints/index.json ] && echo --model runs/multi30k_transformer)

# Preparation throughput and memory, and training memory, for 100k and 5M generated pairs (~20 min).
bench-scale: install
	$(BIN)/python scripts/bench_scale.py --pairs 100000 5000000 --updates 100 --json runs/bench_scale.json

# CUDA tests, bf16/fp16 training checks, batched beam search and Transformer-base speed on a GPU.
# The Python is GPU_PY where given, else the first of .venv's and python3 whose torch sees a GPU (a
# GPU machine without network has only its own), else .venv, installed. Multi30k is fetched where
# data/multi30k lacks it (MULTI30K_DIR, else a download); where that fails, only the bench is not run.
# Where no Python sees a GPU, .venv's runs the check at once, which says so in one line: no download.
GPU_PY ?=
# Prints that Python; fails where none is found. (`make -n` runs the first line, which only looks.)
find_gpu_python = $(if $(GPU_PY),echo '$(GPU_PY)',for py in $(BIN)/python python3; do \
	$$py -c 'import sys; import torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && echo $$py && exit 0; \
	done; exit 1)
gpu-check:
	@($(find_gpu_python)) >/dev/null || $(MAKE) --no-print-directory install
	@py=$$($(find_gpu_python)) || { $(BIN)/python scripts/gpu_check.py; exit $$?; }; echo "gpu-check: $$py"; \
	$$py scripts/get_multi30k.py --out data/multi30k || echo "gpu-check: no Multi30k: the bench will not run"; \
	$$py scripts/gpu_check.py --data data/multi30k

clean:
	rm -rf runs data/demo
