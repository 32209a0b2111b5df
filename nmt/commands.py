"""What each ``nmt`` command does, given its parsed arguments: each calls the pipeline stages
and turns nothing into output itself. The arguments are defined in ``nmt.cli``."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from nmt.console import say
from nmt.errors import NMTError


def log(message: str) -> None:
    """Progress and results for the user: stderr, above any progress bar."""
    say(message)


def cmd_train(args: argparse.Namespace) -> int:
    from nmt import distributed, rank_failures
    from nmt.config import check_on_this_machine, load_config
    from nmt.run_config import check_saved_corpora
    from nmt.training import train

    with rank_failures.reported_once(distributed.world_from_environment()):  # under torchrun
        cfg = load_config(args.config, args.set)
        check_on_this_machine(cfg, args.config, args.set)
        check_saved_corpora(cfg, Path(args.config), ("train", "dev"), overrides=args.set)
        train(cfg, log, Path(args.config), args.set)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    import time

    from nmt.config import load_config
    from nmt.prepare import prepare
    from nmt.run_config import check_saved_corpora
    from nmt.rundir import RunDir

    cfg = load_config(args.config, args.set)
    check_saved_corpora(cfg, Path(args.config), ("train", "dev"), overrides=args.set)
    run = RunDir(cfg.run_dir)
    cfg = run.open_for_training(cfg, Path(args.config), log, "prepare", args.set)
    try:
        start = time.perf_counter()
        data = prepare(cfg, run, log)
        seconds = time.perf_counter() - start
        data.train.close()
        run.write_config(cfg)  # only once prepared: a failed start leaves the run's config as it was
    finally:
        run.close()
    train = shlex.join(["nmt", "train", "--config", args.config, *(a for kv in args.set for a in ("--set", kv))])
    log(
        f"prepared {len(data.train)} training pairs in {seconds:.1f} s "
        f"({len(data.train) / max(seconds, 1e-9):.0f} pairs/s); '{train}' reuses them"
    )
    return 0


def _decode_config(args: argparse.Namespace, cfg, run):
    """The run's ``cfg.decode`` with the decoding options given on the command line."""
    from dataclasses import replace

    from nmt.config_checks import check_beam_size

    changes = {}
    for name in ("beam_size", "length_penalty", "max_len_a", "max_len_b", "batch_tokens", "nbest"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    decode = replace(cfg.decode, **changes)
    if decode.nbest > decode.beam_size:
        raise NMTError(_nbest_beyond_beam(decode.nbest, decode.beam_size, changes, run.config_path))
    if "beam_size" in changes:  # the config's own was checked when it was read
        check_beam_size(decode.beam_size, cfg.tokenizer.vocab_size, "--beam-size")
    return decode


def _nbest_beyond_beam(nbest: int, beam: int, given: dict, config: Path) -> str:
    """The error for an n-best count above the beam, naming where each came from (the command line
    or the run's config) and what to give instead."""
    beam_from = "" if "beam_size" in given else f" (decode.beam_size in {config})"
    if "nbest" in given:
        return f"--nbest {nbest} is more than the beam size {beam}{beam_from}: give --beam-size {nbest} or more"
    fewer = f"--nbest {beam} or less (1: one translation per line)"
    if beam == 1:
        fewer = "--nbest 1 (one translation per line)"
    return (
        f"decode.nbest {nbest} in {config} is more than the beam size {beam}{beam_from}: "
        f"give {fewer}, or --beam-size {nbest} or more"
    )


def _attention_writer(args: argparse.Namespace, cfg, translator):
    if not getattr(args, "attention", None):
        return None
    from nmt.attention_maps import AttentionWriter, choose

    selection = choose(args.attention_layer, args.attention_head, cfg.model)
    return AttentionWriter(Path(args.attention), translator.src_tok, translator.trg_tok, selection, images=True)


def _translate_to(args: argparse.Namespace, run, cfg, source: Path | None, sink) -> int:
    """Translate ``source`` (stdin if None) into ``sink`` with the run's checkpoint and the decoding
    options given (``cfg``: the run's config); returns the lines read."""
    from nmt.streams import translate_into
    from nmt.translate import load_translator

    try:
        decode = _decode_config(args, cfg, run)
        which = "auto" if args.checkpoint is None else args.checkpoint  # "" is no checkpoint, not auto
        translator = load_translator(run, args.device or "auto", args.precision, log, which, decode)
        maps = _attention_writer(args, cfg, translator)
    except BaseException:
        sink.discard()
        raise
    return translate_into(translator, source, sink, decode, getattr(args, "stream", False), maps)


def _check_not_in_maps(maps: Path, files: list[tuple[str, str | None]]) -> None:
    """The attention maps' directory gets NNNNN.png and NNNNN.json: it may hold neither the input
    nor the output, which a map of the same name would overwrite or be overwritten by."""
    import os

    for option, name in files:
        if name not in (None, "-") and os.path.realpath(Path(name).parent) == os.path.realpath(maps):
            raise NMTError(f"{option} {name}: lies in the --attention directory {maps}, where the maps go: move it")


def _check_not_in_run(output: str | None, run, cfg) -> None:
    """``--output`` may be a new file in the run directory, never one of the run's own."""
    if output not in (None, "-"):
        run.check_output(Path(output), "--output", cfg)


def cmd_translate(args: argparse.Namespace) -> int:
    from nmt.files import check_output_dir
    from nmt.rundir import RunDir
    from nmt.streams import check_text, input_file, open_output

    for option, value in (("--attention-layer", args.attention_layer), ("--attention-head", args.attention_head)):
        if value is not None and not args.attention:
            raise NMTError(f"{option} {value}: needs --attention DIR (it chooses what the attention maps show)")
    run = RunDir.existing(args.model)  # a wrong run directory is reported before reading any input
    cfg = run.config()
    _decode_config(args, cfg, run)  # and so are decoding options that contradict each other
    if args.attention:
        from nmt.attention_maps import choose, figure_class

        choose(args.attention_layer, args.attention_head, cfg.model)
        figure_class()
        check_output_dir(Path(args.attention), [run.path], "--attention")
    source = input_file(args.input, "--input")
    if args.attention:
        _check_not_in_maps(Path(args.attention), [("--input", args.input), ("--output", args.output)])
    sink = open_output(args.output, [p for p in [source] if p] + run.model_files(cfg), "--output")
    _check_not_in_run(args.output, run, cfg)
    check_text(source)  # the options first, then the input's text, then the work
    _translate_to(args, run, cfg, source, sink)
    return 0


# What eval-bleu uses only to translate: with --hyp each would be silently ignored.
_TRANSLATING_OPTIONS = (
    "model",
    "src",
    "output",
    "beam_size",
    "length_penalty",
    "max_len_a",
    "max_len_b",
    "batch_tokens",
    "precision",
    "device",
    "checkpoint",
)


def _check_hyp_alone(args: argparse.Namespace) -> None:
    """--hyp scores a file as it is: refuse it with any option for translating one."""
    given = [f"--{name.replace('_', '-')}" for name in _TRANSLATING_OPTIONS if getattr(args, name) is not None]
    if args.hyp is not None and given:
        raise NMTError(
            f"conflicting options: --hyp with {', '.join(given)}: --hyp scores a file as it is; "
            "to translate and score, give --model RUN_DIR --src FILE without --hyp"
        )


def _check_bleu_tokenizer(name: str | None) -> None:
    from typing import get_args

    from nmt.config import BleuTokenizer

    if name is not None and name not in get_args(BleuTokenizer):
        raise NMTError(f"--tokenize {name!r} is not one of {', '.join(map(repr, get_args(BleuTokenizer)))}")


def _scored_lines(name: str, option: str) -> list[str]:
    """The lines of a hypothesis or reference file, or of standard input for '-' (a pipe from
    ``nmt translate``, as sacreBLEU and fairseq-score read one): '-' was 'no such file'."""
    from nmt.corpus import read_lines
    from nmt.streams import input_file, input_windows

    if name != "-":
        return read_lines(Path(name))
    input_file(name, option)  # a closed stdin is an error naming the option
    return [line for window in input_windows(None) for line in window]


def _input_name(name: str) -> str:
    """How the scores and their errors name an input of eval-bleu's: '-' is standard input."""
    return "<stdin>" if name == "-" else name


def _check_one_stdin(args: argparse.Namespace) -> None:
    """Standard input can be read once: by one of --hyp, --src and the references."""
    named = [f"--{option} -" for option in ("hyp", "src") if getattr(args, option) == "-"]
    named += ["--ref -"] * args.ref.count("-")
    if len(named) > 1:
        raise NMTError(f"conflicting options: {' and '.join(named)}: standard input can be read once; give files")


def cmd_eval_bleu(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from nmt.corpus import read_lines
    from nmt.files import check_stdout, write_stdout
    from nmt.scoring import bleu_metric, check_line_counts, check_run_bleu, corpus_scores

    _check_hyp_alone(args)
    _check_one_stdin(args)
    _check_bleu_tokenizer(args.tokenize)
    check_stdout("eval-bleu prints the scores there")  # before translating, not after
    refs = [_scored_lines(r, "--ref") for r in args.ref]
    ref_names = [_input_name(r) for r in args.ref]
    tokenize, lowercase = args.tokenize or "13a", bool(args.lowercase)
    if not args.model:
        bleu_metric(tokenize, lowercase, "--tokenize")  # a tokenizer that cannot run: before reading
    if args.model:
        from nmt.rundir import RunDir
        from nmt.streams import StdoutLines, input_file, open_output

        if not args.src:
            raise NMTError("eval-bleu --model needs --src FILE (the source side to translate)")
        run = RunDir.existing(args.model)
        cfg = run.config()
        # eval-bleu scores, and writes, the best translation: the run's decode.nbest is translate's
        cfg = replace(cfg, decode=replace(cfg.decode, nbest=1))
        _decode_config(args, cfg, run)
        tokenize = args.tokenize or cfg.decode.bleu_tokenize
        lowercase = cfg.decode.bleu_lowercase if args.lowercase is None else args.lowercase
        # A tokenizer that cannot run is said before translating, naming the option or the run's config.
        if args.tokenize:
            bleu_metric(tokenize, lowercase, "--tokenize")
        else:
            check_run_bleu(tokenize, lowercase, run.config_path)
        source = input_file(args.src, "--src")
        src_name = _input_name(args.src)
        if source is not None and source.is_file():  # stdin or a pipe can be read only once: checked after
            check_line_counts(src_name, sum(1 for _ in read_lines(source)), refs, ref_names)
        inputs = [source, *(Path(r) for r in args.ref if r != "-"), *run.model_files(cfg)]
        sink = open_output(args.output, inputs, "--output", collect=True)
        _check_not_in_run(args.output, run, cfg)
        _translate_to(args, run, cfg, source, sink)
        hyps = sink.collected
        if args.output == "-":
            StdoutLines().write(hyps)
        hyp_name = f"translation of {src_name}"
    else:
        if not args.hyp:
            raise NMTError("eval-bleu needs --hyp FILE, or --model RUN_DIR with --src FILE")
        hyps = _scored_lines(args.hyp, "--hyp")
        hyp_name = _input_name(args.hyp)
    scores = corpus_scores(hyps, refs, ref_names, hyp_name, tokenize, lowercase)
    write_stdout(json.dumps(scores.to_dict(), indent=1) + "\n" if args.json else scores.summary() + "\n")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from nmt.average import average_run
    from nmt.rundir import RunDir

    average_run(RunDir.existing(args.model), args.last, args.device, log)
    return 0


def cmd_tune_decode(args: argparse.Namespace) -> int:
    from nmt.rundir import RunDir
    from nmt.tune_decode import tune_decode

    run = RunDir.existing(args.model)
    which = "auto" if args.checkpoint is None else args.checkpoint  # as translate's: "" is no checkpoint
    tune_decode(run, args.beam_sizes, args.length_penalties, args.device, which, log)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from nmt import bench
    from nmt.config import check_on_this_machine, check_with_place, load_config

    cfg = load_config(args.config, args.set)
    check_on_this_machine(cfg, args.config, args.set)
    check_with_place(bench.decoded_pairs, cfg, args.config, args.set)  # before minutes of training
    model = None if args.model is None else bench.model_decoding(Path(args.model), cfg, args.set)
    bench.main(cfg, Path(args.config), model, args.updates, args.warmup, args.decode_sentences, args.json, log)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import sys

    from nmt.compare import compare
    from nmt.files import write_stdout

    table = compare([Path(d) for d in args.runs], Path(args.out), log)
    if sys.stdout is not None:  # closed (>&-): the table is in the report's compare.md
        write_stdout(table + "\n")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from nmt.plot import plot_runs

    plot_runs([Path(d) for d in args.runs], Path(args.out), log)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from nmt.export import export_run

    export_run(Path(args.run_dir), Path(args.out_dir), args.quantization, log)
    return 0
