"""Translation: load a finished run, batch sentences by length, search, detokenize in input order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt import autotune, checkpoint
from nmt.batching import make_batch, sentence_batches
from nmt.config import Config, DecodeConfig, load_config
from nmt.device import Precision, bf16_available, check_precision, prepare_cpu_process, select_device
from nmt.errors import NMTError
from nmt.models import build_model
from nmt.models.base import Seq2Seq
from nmt.search import beam_search, greedy_search
from nmt.tokenizer import Tokenizer, load_tokenizers


def max_source_length(max_positions: int | None, decode: DecodeConfig) -> int:
    """Longest source (in subwords, before EOS) whose source and allowed output both fit the
    model's positions: src + 1 <= P and a * src + b <= P - 1. Longer inputs are truncated."""
    if max_positions is None:
        return 1 << 30
    limit = max_positions - 1
    if decode.max_len_a > 0:
        limit = min(limit, int((max_positions - 1 - decode.max_len_b) / decode.max_len_a))
    return max(1, limit)


@dataclass
class Translator:
    """A model with its tokenizers, ready to translate text."""

    model: Seq2Seq
    src_tok: Tokenizer
    trg_tok: Tokenizer
    device: torch.device
    precision: Precision

    def translate_ids(
        self,
        src_ids: list[list[int]],
        decode: DecodeConfig,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[tuple[list[int], float]]]:
        """N-best (ids, score) per sentence, in input order."""
        was_training = self.model.training
        self.model.eval()
        tok = self.trg_tok
        results: list[list[tuple[list[int], float]]] = [[] for _ in src_ids]
        max_src = max_source_length(self.model.max_positions, decode)
        src_ids = [s[:max_src] for s in src_ids]
        lengths = [len(s) for s in src_ids]
        # no_grad, not inference_mode: autocast keeps its bf16 copy of each weight for the whole
        # call only outside inference mode; otherwise every step casts every weight again.
        with torch.no_grad(), self.precision.autocast():
            for rows in sentence_batches(lengths, decode.batch_tokens):
                batch = make_batch([src_ids[i] for i in rows], None, rows, tok.pad_id, tok.bos_id, tok.eos_id)
                batch = batch.to(self.device)
                if decode.beam_size == 1 and decode.nbest == 1:
                    src_len = batch.src_mask.sum(1) - 1
                    max_len = (decode.max_len_a * src_len.float() + decode.max_len_b).long()
                    hyps = greedy_search(self.model, batch.src, batch.src_mask, max_len, tok.bos_id, tok.eos_id)
                    nbest = [[(h, 0.0)] for h in hyps]
                else:
                    nbest = beam_search(
                        self.model,
                        batch.src,
                        batch.src_mask,
                        beam_size=max(decode.beam_size, decode.nbest),
                        length_penalty=decode.length_penalty,
                        max_len_a=decode.max_len_a,
                        max_len_b=decode.max_len_b,
                        bos_id=tok.bos_id,
                        eos_id=tok.eos_id,
                        pad_id=tok.pad_id,
                        nbest=decode.nbest,
                    )
                for row, hyps in zip(rows, nbest):
                    results[row] = hyps
                if progress is not None:
                    progress(len(rows))
        self.model.train(was_training)
        return results

    def translate(
        self, lines: list[str], decode: DecodeConfig, progress: Callable[[int], None] | None = None
    ) -> list[list[str]]:
        """Detokenized n-best translations per input line, in input order; a blank line stays blank."""
        filled = [i for i, line in enumerate(lines) if line.strip()]
        src_ids = self.src_tok.encode([lines[i] for i in filled])
        nbest = self.translate_ids(src_ids, decode, progress)
        texts = iter(self.trg_tok.decode([ids for hyps in nbest for ids, _ in hyps]))
        out: list[list[str]] = [[""] for _ in lines]
        for i, hyps in zip(filled, nbest):
            out[i] = [next(texts) for _ in hyps]
        return out


def load_run_config(run_dir: Path) -> Config:
    if not run_dir.exists():
        raise NMTError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise NMTError(f"{run_dir}: is not a directory (expected a run directory made by 'nmt train')")
    path = run_dir / "config.yaml"
    if not path.exists():
        raise NMTError(f"{run_dir}: not a run directory (no config.yaml): train one with 'nmt train --config FILE'")
    return load_config(path)


def load_translator(
    run_dir: Path,
    device_name: str = "auto",
    precision_name: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Translator:
    """Load a run's best checkpoint (or, failing that, its latest) for translation.

    Precision, attention kernel and threads are the run's ``train`` settings (``precision_name``
    overrides the first); where they say auto, the choice is the one ``nmt train`` measured and
    cached on this machine for this model, or is measured now the same way.
    """
    cfg = load_run_config(run_dir)
    manager = checkpoint.CheckpointManager(run_dir / "checkpoints", cfg.train.keep_last, cfg.train.keep_best)
    path = manager.best_path()
    if path is None:
        latest = checkpoint.list_checkpoints(run_dir / "checkpoints", "update")
        if not latest:
            raise NMTError(f"{run_dir}: the run has no checkpoint yet: it is not a finished run")
        path = latest[0].path
    payload = checkpoint.load(path)
    src_tok, trg_tok = load_tokenizers(run_dir, cfg.tokenizer.joint, cfg.data.src_lang, cfg.data.trg_lang)
    device = select_device(device_name, key="--device")
    if device.type == "cpu":
        prepare_cpu_process()
    if precision_name is not None:
        check_precision(precision_name, device.type, bf16_available(device), key="--precision")
    request = autotune.Request.from_train(cfg.train, precision_name)
    choice = autotune.choose(
        request, cfg.model, trg_tok.vocab_size, cfg.train.max_tokens, cfg.data.max_len, device, log or _quiet
    )
    autotune.apply_threads(choice)
    if log is not None and choice.timings:
        log("auto: " + choice.describe())
    model = build_model(cfg.model, src_tok.vocab_size, trg_tok.vocab_size, trg_tok.pad_id)
    model.load_state_dict(payload["model"])
    model.set_attention_kernel(choice.attention)
    model.to(device).eval()
    return Translator(model, src_tok, trg_tok, device, Precision(device.type, choice.precision))


def _quiet(message: str) -> None:
    pass
