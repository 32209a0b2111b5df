"""Translation: load a finished run, batch sentences by length, search, detokenize in input order.
Where the lines come from and go to is ``nmt.streams``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt import autotune, checkpoint_choice, checkpoint_file
from nmt.batching import make_batch, sentence_batches
from nmt.config import DecodeConfig
from nmt.config_checks import check_beam_size
from nmt.console import say
from nmt.device import (
    Precision,
    bf16_available,
    check_precision,
    precision_problem,
    prepare_cpu_process,
    select_device,
)
from nmt.errors import NMTError
from nmt.kernel_choice import Request
from nmt.model_memory import check_weights_fit, size_keys
from nmt.models import build_model
from nmt.models.base import Seq2Seq
from nmt.rundir import RunDir
from nmt.search import Hypothesis, beam_search, greedy_search, max_output_lengths
from nmt.tokenizer import Tokenizer, load_tokenizers


def max_source_length(max_positions: int | None) -> int | None:
    """Longest source (in subwords, before EOS) the model's positions hold: src + 1 <= P; None: any.
    Only a source longer than that is truncated: a large max_len_a/b caps the output length
    (``max_output_lengths``), never the source."""
    return None if max_positions is None else max_positions - 1


def is_translated(line: str, ids: list[int]) -> bool:
    """Whether a line is translated: not blank, and with a subword left after the tokenizer's
    normalization. A source of EOS alone tells the model nothing of the line: whatever it wrote
    would be invented."""
    return bool(line.strip()) and bool(ids)


def truncated_sources(src_ids: list[list[int]], max_src: int | None) -> list[int]:
    """Indices of the sources longer than ``max_src`` subwords (none when the model has no limit)."""
    return [] if max_src is None else [i for i, ids in enumerate(src_ids) if len(ids) > max_src]


def truncation_warning(line_numbers: list[int], max_src: int) -> str:
    """One warning naming the input lines (1-based) whose source was cut to ``max_src`` subwords."""
    shown = ", ".join(map(str, line_numbers[:10])) + (" ..." if len(line_numbers) > 10 else "")
    lines = f"line {shown} is" if len(line_numbers) == 1 else f"lines {shown} ({len(line_numbers)} lines) are"
    return (
        f"warning: input {lines} longer than the model's positions allow ({max_src} subwords): "
        f"translated from the first {max_src} subwords only"
    )


def unknown_warning(found: list[tuple[int, list[str]]]) -> str:
    """One warning naming the input lines (1-based) with text the source tokenizer never saw in
    training, and the first few such stretches: the model reads each as one unknown piece, and a
    name or symbol in it is usually missing from the translation."""
    numbers = [n for n, _ in found]
    shown = ", ".join(map(str, numbers[:10])) + (" ..." if len(numbers) > 10 else "")
    lines = f"line {shown} holds" if len(numbers) == 1 else f"lines {shown} ({len(numbers)} lines) hold"
    examples = list(dict.fromkeys(text for _, texts in found for text in texts))
    quoted = ", ".join(repr(t) for t in examples[:5]) + (" ..." if len(examples) > 5 else "")
    return (
        f"warning: input {lines} text the tokenizer never saw in training ({quoted}): "
        "the model reads it as unknown, and the translation may leave it out"
    )


@dataclass
class Translator:
    """A model with its tokenizers, ready to translate text. It decodes with its own attention kernel
    and fp32 product library (``kernel_choice.Choice.decoding``: measured on decoding steps, where they may
    differ from training's), and gives the model back as it found it (the trainer validates with
    the model it trains)."""

    model: Seq2Seq
    src_tok: Tokenizer
    trg_tok: Tokenizer
    device: torch.device
    precision: Precision
    warn: Callable[[str], None] | None = None  # where truncated sources are reported; None: stderr
    kernels: tuple[str, str] | None = None  # (attention kernel, fp32 library) for decoding; None: the model's
    checkpoint: Path | None = None  # the run's checkpoint it was loaded from (``load_translator``)

    def translate_ids(
        self,
        src_ids: list[list[int]],
        decode: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        attention: bool = False,
    ) -> list[list[Hypothesis]]:
        """The n-best hypotheses of each sentence, best first, in input order. ``progress`` is told
        the source tokens of each batch done (the cost of a sentence grows with its length). With
        ``attention`` each hypothesis carries its weights over the sentence's source tokens (EOS last)."""
        model = self.model
        was = model.training, model.attention_kernel, model.fp32_matmul
        model.eval()
        if self.kernels is not None:
            model.set_attention_kernel(self.kernels[0])
            model.set_fp32_matmul(self.kernels[1])
        try:
            return self._translate_ids(src_ids, decode, progress, attention)
        finally:
            model.train(was[0])
            model.set_attention_kernel(was[1])
            model.set_fp32_matmul(was[2])

    def _translate_ids(
        self, src_ids: list[list[int]], decode: DecodeConfig, progress: Callable[[int], None] | None, attention: bool
    ) -> list[list[Hypothesis]]:
        tok = self.trg_tok
        results: list[list[Hypothesis]] = [[] for _ in src_ids]
        max_positions = self.model.max_positions
        max_src = max_source_length(max_positions)
        costs = [len(s) + 1 for s in src_ids]  # progress counts a cut line whole, as the bar's total does
        src_ids = [s[:max_src] for s in src_ids]  # translate_scored has said which lines it cuts
        lengths = [len(s) for s in src_ids]
        # no_grad, not inference_mode: autocast keeps its bf16 copy of each weight for the whole
        # call only outside inference mode; otherwise every step casts every weight again.
        # Batches come sorted by length; taken in a fixed shuffled order, the progress bar's rate
        # (and its ETA) is that of the whole input from the start, not of the shortest sentences.
        batches = sentence_batches(lengths, decode.batch_tokens)
        random.Random(0).shuffle(batches)
        with torch.no_grad(), self.precision.autocast():
            for rows in batches:
                batch = make_batch([src_ids[i] for i in rows], None, rows, tok.pad_id, tok.bos_id, tok.eos_id)
                batch = batch.to(self.device)
                limit = max_output_lengths(batch.src_mask, decode.max_len_a, decode.max_len_b, max_positions)
                if decode.beam_size == 1 and decode.nbest == 1:
                    found = greedy_search(
                        self.model, batch.src, batch.src_mask, limit, tok.bos_id, tok.eos_id, attention
                    )
                    nbest = [[h] for h in found]
                else:
                    nbest = beam_search(
                        self.model,
                        batch.src,
                        batch.src_mask,
                        limit,
                        beam_size=decode.beam_size,
                        length_penalty=decode.length_penalty,
                        bos_id=tok.bos_id,
                        eos_id=tok.eos_id,
                        nbest=decode.nbest,
                        attention=attention,
                    )
                for row, hyps in zip(rows, nbest):
                    for h in hyps if attention else ():
                        h.attention = h.attention[..., : lengths[row] + 1]  # the sentence's own tokens and EOS
                    results[row] = hyps
                if progress is not None:
                    progress(sum(costs[i] for i in rows))
        return results

    def translate(
        self, lines: list[str], decode: DecodeConfig, progress: Callable[[int], None] | None = None
    ) -> list[list[str]]:
        """Detokenized n-best translations per input line, in input order; a blank line stays blank."""
        return [[text for text, _ in hyps] for hyps in self.translate_scored(lines, decode, progress)]

    def translate_scored(
        self,
        lines: list[str],
        decode: DecodeConfig,
        progress: Callable[[int], None] | None = None,
        attention: bool = False,
        first_line: int = 1,
        say_unknown: bool = False,
    ) -> list[list[tuple[str, Hypothesis | None]]]:
        """Per input line its n-best (text, hypothesis), in input order; a blank line stays blank
        (one empty translation, no hypothesis), as does one the tokenizer encodes to no subword
        (zero-width or control characters only, which its normalization removes). A line too long
        for the model is translated from its beginning, and ``warn`` is told its number
        (``lines[0]`` is line ``first_line``); with ``say_unknown`` so are the lines holding text
        the tokenizer never saw (``unknown_warning``)."""
        if decode.nbest > decode.beam_size:
            raise NMTError(f"n-best {decode.nbest} is more than the beam size {decode.beam_size}: raise the beam size")
        check_beam_size(decode.beam_size, self.trg_tok.vocab_size, "beam size")
        encoded = self.src_tok.encode(lines)
        if say_unknown:
            found = enumerate(self.src_tok.unknown_text(lines, encoded))
            unknown = [(first_line + i, texts) for i, texts in found if texts]
            if unknown:
                (self.warn or say)(unknown_warning(unknown))
        filled = [i for i, (line, ids) in enumerate(zip(lines, encoded)) if is_translated(line, ids)]
        src_ids = [encoded[i] for i in filled]
        max_src = max_source_length(self.model.max_positions)
        cut = truncated_sources(src_ids, max_src)
        if cut:
            (self.warn or say)(truncation_warning([first_line + filled[i] for i in cut], max_src))
        nbest = self.translate_ids(src_ids, decode, progress, attention)
        texts = iter(self.trg_tok.decode([h.tokens for hyps in nbest for h in hyps]))
        out: list[list[tuple[str, Hypothesis | None]]] = [[("", None)] for _ in lines]
        for i, hyps in zip(filled, nbest):
            out[i] = [(next(texts), h) for h in hyps]
        return out


def nbest_lines(index: int, hyps: list[tuple[str, Hypothesis | None]], length_penalty: float) -> list[str]:
    """Moses/Marian n-best lines: ``INDEX ||| TEXT ||| F0= LOGPROB ||| SCORE``: the model score
    (the summed log-probabilities of the tokens, EOS included) and the length-normalised score
    LOGPROB / length ** length_penalty that ranks them; index 0-based, best first."""
    out = []
    for text, h in hyps:
        log_prob, score = (0.0, 0.0) if h is None else (h.log_prob, h.score(length_penalty))
        out.append(f"{index} ||| {text} ||| F0= {log_prob:.5f} ||| {score:.5f}")
    return out


def translate_stream(
    translator: Translator,
    windows: Iterator[list[str]],
    decode: DecodeConfig,
    write: Callable[[list[str]], None],
    progress: Callable[[int], None] | None = None,
    attention: Callable[[int, str, str, Hypothesis], None] | None = None,
) -> int:
    """Translate window after window, handing each window's output lines to ``write`` in input
    order as soon as it is done: with ``decode.nbest`` above 1 the n-best of each line as n-best
    lines, else (one hypothesis per line) the best one's text; returns the lines read.
    ``attention``, if given, receives (line index, source, translation, best hypothesis) of every
    non-blank line, the hypothesis with its attention weights."""
    done = 0
    for window in windows:
        # Unknown text said here, once per line of input, not by every translate_scored: tune-decode
        # translates its dev set many times.
        scored = translator.translate_scored(window, decode, progress, attention is not None, done + 1, True)
        for i, hyps in enumerate(scored if attention is not None else ()):
            text, best = hyps[0]
            if best is not None:
                attention(done + i, window[i], text, best)
        if decode.nbest > 1:
            lines = [out for i, hyps in enumerate(scored) for out in nbest_lines(done + i, hyps, decode.length_penalty)]
        else:
            lines = [hyps[0][0] for hyps in scored]
        write(lines)
        done += len(window)
    return done


def load_translator(
    run: RunDir,
    device_name: str = "auto",
    precision_name: str | None = None,
    log: Callable[[str], None] | None = None,
    which: str = "auto",
    decode: DecodeConfig | None = None,
) -> Translator:
    """A run's checkpoint (``which``: see ``checkpoint_choice.model_checkpoint``), ready to translate.

    ``decode``: the decoding the caller translates with where it is the run's own (its config's,
    with any options given); where its pair is the one 'nmt tune-decode' chose with another
    checkpoint than this one, a note says so (``checkpoint_choice.retune_note``). None: a decoding of the
    caller's own (validation, benchmarks, tuning itself), which no note concerns.

    Precision, attention kernel, fp32 product library and threads are the run's ``train`` settings
    (``precision_name`` overrides the first; a run's precision this device cannot run, unlike one
    given here, is taken as auto, with a warning); where they say auto, the choice is the run's own
    (``kernels.json``, where made on this machine, torch and settings), else the one cached on this
    machine for this model, or is measured now the same way. Only reads the run.
    """
    cfg = run.config()
    path = checkpoint_choice.model_checkpoint(run, cfg, which)
    src_tok, trg_tok = load_tokenizers(*run.tokenizer_paths(cfg))
    device = select_device(device_name, key="--device")
    if device.type == "cpu":
        prepare_cpu_process()
    bf16 = bf16_available(device)
    if precision_name is not None:
        check_precision(precision_name, device.type, bf16, key="--precision")
    # The run's precision is only a runtime setting for decoding (checkpoints hold fp32 weights):
    # one this device lacks (fp16 trained on a GPU, bf16 on a CPU with bf16 units) gives way to auto.
    unusable = None if precision_name is not None else precision_problem(cfg.train.precision, device.type, bf16)
    # Before the checkpoint is read: a model whose weights alone cannot fit here fails in one line.
    keys = size_keys(cfg.model, src_tok.vocab_size, trg_tok.vocab_size)
    check_weights_fit(checkpoint_file.model_bytes(path), device, path, keys)
    path, payload = checkpoint_choice.load_model_checkpoint(run, cfg, which, path)
    model = build_model(cfg.model, src_tok.vocab_size, trg_tok.vocab_size, trg_tok.pad_id)
    run.check_checkpoint(path, payload, cfg, model)
    model.load_state_dict(payload["model"])
    request = Request.from_train(cfg.train, "auto" if unusable else precision_name)
    # The run's own choice where it holds one for this machine: validation decoded in it.
    choice = autotune.choose(
        request,
        cfg.model,
        trg_tok.vocab_size,
        cfg.train.max_tokens,
        cfg.data.max_len,
        device,
        log or _quiet,
        run_record=run.kernels_path,
        record_use="read",
    )
    if unusable:
        (log or say)(
            f"warning: the run's train.precision {cfg.train.precision} cannot run here ({unusable}): decoding in "
            f"{choice.precision}, auto's choice on this machine"
        )
    autotune.apply_threads(choice)
    if log is not None and choice.timings:
        log("auto: " + choice.describe())
    attention, fp32_matmul = choice.decoding()
    model.set_attention_kernel(attention)
    model.set_fp32_matmul(fp32_matmul)
    model.to(device).eval()
    precision = Precision(device.type, choice.precision)
    note = None if decode is None else checkpoint_choice.retune_note(run, path, which, decode, "loaded")
    if note is not None:
        (log or say)(note)
    return Translator(model, src_tok, trg_tok, device, precision, log, choice.decoding(), path)


def _quiet(message: str) -> None:
    pass
