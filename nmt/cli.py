"""The ``nmt`` command: parses arguments and calls the pipeline stages; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nmt.errors import NMTError


def _log(message: str) -> None:
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def cmd_train(args: argparse.Namespace) -> int:
    from nmt.config import load_config
    from nmt.training import train

    cfg = load_config(args.config, args.set)
    train(cfg, _log, Path(args.config))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    import time

    from nmt.config import load_config
    from nmt.prepare import prepare
    from nmt.rundir import RunDir

    cfg = load_config(args.config, args.set)
    run = RunDir(cfg.run_dir)
    run.open_for_training(cfg, Path(args.config), _log)
    try:
        start = time.perf_counter()
        data = prepare(cfg, run, _log)
        seconds = time.perf_counter() - start
        data.train.close()
    finally:
        run.close()
    _log(
        f"prepared {len(data.train)} training pairs in {seconds:.1f} s "
        f"({len(data.train) / max(seconds, 1e-9):.0f} pairs/s); 'nmt train --config {args.config}' reuses them"
    )
    return 0


def _decode_config(args: argparse.Namespace, base):
    from dataclasses import replace

    changes = {}
    for name in ("beam_size", "length_penalty", "max_len_a", "max_len_b", "batch_tokens", "nbest"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    decode = replace(base, **changes)
    if decode.nbest > decode.beam_size:
        raise NMTError(
            f"--nbest {decode.nbest} is more than the beam size {decode.beam_size}: "
            f"give --beam-size {decode.nbest} or more"
        )
    return decode


def _attention_writer(args: argparse.Namespace, run, translator):
    if not getattr(args, "attention", None):
        return None
    from nmt.attention_maps import AttentionWriter, choose

    selection = choose(args.attention_layer, args.attention_head, run.config().model)
    return AttentionWriter(Path(args.attention), translator.src_tok, translator.trg_tok, selection, images=True)


def _translate_to(args: argparse.Namespace, run, source: Path | None, sink) -> int:
    """Translate ``source`` (stdin if None) into ``sink`` with the run's checkpoint and the decoding
    options given; returns the lines read."""
    from nmt.streams import translate_into
    from nmt.translate import load_translator

    try:
        decode = _decode_config(args, run.config().decode)
        translator = load_translator(run, args.device, args.precision, _log, args.checkpoint)
        maps = _attention_writer(args, run, translator)
    except BaseException:
        sink.discard()
        raise
    return translate_into(translator, source, sink, decode, getattr(args, "stream", False), maps)


def cmd_translate(args: argparse.Namespace) -> int:
    from nmt.files import check_output_dir
    from nmt.rundir import RunDir
    from nmt.streams import input_file, open_output

    run = RunDir.existing(args.model)  # a wrong run directory is reported before reading any input
    _decode_config(args, run.config().decode)  # and so are decoding options that contradict each other
    if args.attention:
        from nmt.attention_maps import choose, figure_class

        choose(args.attention_layer, args.attention_head, run.config().model)
        figure_class()
        check_output_dir(Path(args.attention), [run.path], "--attention")
    source = input_file(args.input, "--input")
    sink = open_output(args.output, [p for p in [source] if p] + run.model_files(run.config()), "--output")
    _translate_to(args, run, source, sink)
    return 0


def cmd_eval_bleu(args: argparse.Namespace) -> int:
    from nmt.corpus import read_lines
    from nmt.scoring import corpus_scores

    refs = [read_lines(Path(r)) for r in args.ref]
    if args.model:
        from nmt.rundir import RunDir
        from nmt.streams import CollectedLines, StdoutLines, input_file, open_output

        if not args.src:
            raise NMTError("eval-bleu --model needs --src FILE (the source side to translate)")
        run = RunDir.existing(args.model)
        _decode_config(args, run.config().decode)
        source = input_file(args.src, "--src")
        n_src = sum(1 for _ in read_lines(source))
        if n_src != len(refs[0]):
            raise NMTError(f"{args.src} has {n_src} lines but {args.ref[0]} has {len(refs[0])}")
        inputs = [source, *map(Path, args.ref), *run.model_files(run.config())]
        to_file = args.output not in (None, "-")
        sink = open_output(args.output, inputs, "--output") if to_file else CollectedLines()
        _translate_to(args, run, source, sink)
        hyps = read_lines(Path(args.output)) if to_file else sink.collected
        if args.output == "-":
            StdoutLines().write(hyps)
        hyp_name = f"translation of {args.src}"
    else:
        if not args.hyp:
            raise NMTError("eval-bleu needs --hyp FILE, or --model RUN_DIR with --src FILE")
        hyps = read_lines(Path(args.hyp))
        hyp_name = args.hyp
    if not hyps:
        raise NMTError(f"{hyp_name}: empty input, nothing to score")
    scores = corpus_scores(hyps, refs, ref_names=list(args.ref))
    if args.json:
        print(json.dumps(scores.to_dict(), indent=1))
    else:
        print(scores.summary())
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from nmt.average import average_run
    from nmt.rundir import RunDir

    average_run(RunDir.existing(args.model), args.last, args.device, _log)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from nmt import bench
    from nmt.config import load_config

    cfg = load_config(args.config, args.set)
    bench.main(cfg, args.model, args.updates, args.warmup, args.decode_sentences, args.json, _log)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from nmt.compare import compare

    print(compare([Path(d) for d in args.runs], Path(args.out), _log))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from nmt.plot import plot_runs

    plot_runs([Path(d) for d in args.runs], Path(args.out), _log)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from nmt.export import export_run

    export_run(Path(args.run_dir), Path(args.out_dir), args.quantization, _log)
    return 0


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding (defaults come from the run's config)")
    g.add_argument("--beam-size", type=_positive_int, help="beam width; 1 is greedy search")
    g.add_argument("--length-penalty", type=_non_negative_float, help="alpha in score / length**alpha")
    g.add_argument("--max-len-a", type=_non_negative_float, help="max output length = a * source length + b")
    g.add_argument("--max-len-b", type=int, help="see --max-len-a")
    g.add_argument("--batch-tokens", type=_positive_int, help="source tokens per decoding batch")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to decode")
    g.add_argument(
        "--checkpoint",
        default="auto",
        metavar="WHICH",
        help="auto (default: the averaged model where its dev BLEU beats the best, else the best), best, "
        "average, last, or a file name in RUN_DIR/checkpoints",
    )
    g.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], help="default: the run's train.precision")


def _add_config_options(p: argparse.ArgumentParser, config_help: str = "YAML config file (see configs/)") -> None:
    p.add_argument("--config", required=True, help=config_help)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value, e.g. --set train.max_updates=500 (repeatable)",
    )


def _train_parsers(sub) -> None:
    p = sub.add_parser(
        "train",
        help="prepare data, train, validate, checkpoint (resumes an existing run)",
        description="Train from a YAML config. Running it again on the same run_dir resumes.",
    )
    _add_config_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "prepare",
        help="tokenize and binarize the training data into the run directory (train does it too)",
        description="Train or reuse SentencePiece and encode the training corpus into memory-mappable shards, "
        "using data.workers processes. An interrupted preparation resumes; 'nmt train' then starts at once.",
    )
    _add_config_options(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser(
        "average",
        help="average a run's last N checkpoints (kept; used by default where dev BLEU says it helps)",
        description="Average the model weights of the run's last N training-state checkpoints, score the "
        "average on the dev set and keep it as checkpoints/average_last_N.pt.",
    )
    p.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'")
    p.add_argument("--last", type=_positive_int, required=True, help="how many of the latest checkpoints")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to score it")
    p.set_defaults(func=cmd_average)


def _translate_parsers(sub) -> None:
    p = sub.add_parser(
        "translate",
        help="translate text with a trained run",
        description="Translate lines of text (stdin by default) with a run's best checkpoint.",
    )
    p.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'")
    p.add_argument("--input", "-i", help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", "-o", help="output file (default: stdout)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="translate each line of stdin alone, as soon as it is read (stdin is otherwise translated in "
        "windows of what has arrived: a line typed at a terminal is answered at once anyway)",
    )
    p.add_argument(
        "--attention",
        metavar="DIR",
        help="also write each line's attention map: DIR/NNNNN.png (heatmap) and DIR/NNNNN.json (all weights)",
    )
    p.add_argument("--attention-layer", default="-1", help="decoder layer to show (default -1, the last), or 'mean'")
    p.add_argument("--attention-head", default="mean", help="attention head to show, or 'mean' (default)")
    p.add_argument(
        "--nbest",
        type=_positive_int,
        help="write the N best translations of each line as Moses/Marian n-best lines: "
        "'INDEX ||| TEXT ||| F0= LOGPROB ||| SCORE' (SCORE = LOGPROB / length**length_penalty)",
    )
    _add_decode_options(p)
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser(
        "eval-bleu",
        help="corpus BLEU and chrF with sacreBLEU",
        description="Score a hypothesis file (or a run's translation of --src) against references.",
    )
    p.add_argument("--hyp", help="hypothesis file, one detokenized sentence per line")
    p.add_argument("--ref", action="append", required=True, help="reference file (repeat for several references)")
    p.add_argument("--model", metavar="RUN_DIR", help="translate --src with this run, then score")
    p.add_argument("--src", help="source file to translate (with --model)")
    p.add_argument("--output", "-o", help="with --model: also write the translations here")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    _add_decode_options(p)
    p.set_defaults(func=cmd_eval_bleu)


def _report_parsers(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure training tokens/s, decoding sentences/s and the matmul peak",
        description="Benchmark a config: real training updates on its data, decoding of its test set, "
        "and the matrix-multiply peak of the same device and precision, in one run.",
    )
    _add_config_options(p, "YAML config whose data and model to use")
    p.add_argument("--model", metavar="RUN_DIR", help="trained run to decode with (default: the untrained model)")
    p.add_argument("--updates", type=_positive_int, default=30, help="timed training updates (default 30)")
    p.add_argument("--warmup", type=_positive_int, default=5, help="untimed updates first (default 5)")
    p.add_argument("--decode-sentences", type=_positive_int, help="decode only the first N test sentences")
    p.add_argument("--json", metavar="FILE", help="write the report here (default: stdout)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "compare",
        help="finished runs side by side: Markdown table and dev-BLEU curves (PNG)",
        description="Summarise finished runs: model, parameters, training time and speed, dev BLEU over wall "
        "time and updates, test BLEU/chrF (beam 5) and decoding speed.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by 'nmt train'")
    p.add_argument("--out", default="report", help="output directory (default: report)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "plot",
        help="PNG curves of runs (loss, dev BLEU, learning rate, gradient norm, tokens/s), also while training",
        description="Draw each scalar of metrics.jsonl against updates and against wall time, runs overlaid: "
        "training loss, dev loss, perplexity and BLEU, learning rate, gradient norm, target tokens/s. "
        "Writes one PNG per scalar and index.md.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by 'nmt train'")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    p.set_defaults(func=cmd_plot)


def _deploy_parsers(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a trained Transformer as a CTranslate2 model (pip install 'nmt[export]')",
        description="Export a run's best checkpoint to an inference engine's format, with its SentencePiece "
        "model(s) and a README; OUT_DIR must be new or empty.",
    )
    p.add_argument("--format", required=True, choices=["ctranslate2"], help="target format")
    p.add_argument("--quantization", help="CTranslate2 weight type, e.g. int8 (default: float32)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by 'nmt train'")
    p.add_argument("out_dir", metavar="OUT_DIR", help="output directory (must not hold files)")
    p.set_defaults(func=cmd_export)


def build_parser() -> argparse.ArgumentParser:
    from nmt import __version__

    parser = argparse.ArgumentParser(
        prog="nmt",
        description="Neural machine translation: train a Transformer or LSTM seq2seq from a YAML config, "
        "translate with beam search, score with sacreBLEU.",
    )
    parser.add_argument("--version", action="version", version=f"nmt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _train_parsers(sub)
    _translate_parsers(sub)
    _report_parsers(sub)
    _deploy_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from nmt.device import enlarge_onednn_cache

    enlarge_onednn_cache()  # before torch builds its first oneDNN kernel
    try:
        return args.func(args)
    except NMTError as e:
        message = str(e).replace("\n", " ")
        print(f"nmt {args.command}: error: {message}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except KeyboardInterrupt:
        print(f"nmt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
