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
    train(cfg, _log)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    import time

    from nmt.config import load_config
    from nmt.prepare import prepare
    from nmt.training import open_run_dir

    cfg = load_config(args.config, args.set)
    run_dir = Path(cfg.run_dir)
    open_run_dir(cfg, run_dir)
    start = time.perf_counter()
    data = prepare(cfg, run_dir, _log)
    seconds = time.perf_counter() - start
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
    return replace(base, **changes)


def _read_input(path: str | None) -> list[str]:
    from nmt.corpus import read_lines

    if path is None or path == "-":
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise NMTError(f"<stdin>:{line}: not valid UTF-8") from None
        return text.splitlines()
    return read_lines(Path(path))


def _translate_lines(args: argparse.Namespace, lines: list[str]):
    from nmt.translate import load_run_config, load_translator

    run_dir = Path(args.model)
    cfg = load_run_config(run_dir)
    decode = _decode_config(args, cfg.decode)
    translator = load_translator(run_dir, args.device, args.precision, _log)
    bar = None
    if sys.stderr.isatty() and lines:
        from tqdm import tqdm

        bar = tqdm(total=len(lines), unit="sent", file=sys.stderr, dynamic_ncols=True)
    outputs = translator.translate(lines, decode, progress=bar.update if bar else None)
    if bar is not None:
        bar.close()
    return outputs


def _write_output(path: str | None, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise NMTError(f"{path}: cannot write output ({e.strerror})") from None


def cmd_translate(args: argparse.Namespace) -> int:
    from nmt.translate import load_run_config

    load_run_config(Path(args.model))  # a wrong run directory is reported before reading any input
    lines = _read_input(args.input)
    outputs = _translate_lines(args, lines)
    if args.nbest and args.nbest > 1:
        flat = [f"{i}\t{hyp}" for i, hyps in enumerate(outputs) for hyp in hyps]
    else:
        flat = [hyps[0] for hyps in outputs]
    _write_output(args.output, flat)
    return 0


def cmd_eval_bleu(args: argparse.Namespace) -> int:
    from nmt.corpus import read_lines
    from nmt.scoring import corpus_scores

    refs = [read_lines(Path(r)) for r in args.ref]
    if args.model:
        if not args.src:
            raise NMTError("eval-bleu --model needs --src FILE (the source side to translate)")
        src = read_lines(Path(args.src))
        if len(src) != len(refs[0]):
            raise NMTError(f"{args.src} has {len(src)} lines but {args.ref[0]} has {len(refs[0])}")
        hyps = [h[0] for h in _translate_lines(args, src)]
        if args.output:
            _write_output(args.output, hyps)
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


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding (defaults come from the run's config)")
    g.add_argument("--beam-size", type=_positive_int, help="beam width; 1 is greedy search")
    g.add_argument("--length-penalty", type=_non_negative_float, help="alpha in score / length**alpha")
    g.add_argument("--max-len-a", type=_non_negative_float, help="max output length = a * source length + b")
    g.add_argument("--max-len-b", type=int, help="see --max-len-a")
    g.add_argument("--batch-tokens", type=_positive_int, help="source tokens per decoding batch")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to decode")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmt",
        description="Neural machine translation: train a Transformer or LSTM seq2seq from a YAML config, "
        "translate with beam search, score with sacreBLEU.",
    )
    from nmt import __version__

    parser.add_argument("--version", action="version", version=f"nmt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

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
        "translate",
        help="translate text with a trained run",
        description="Translate lines of text (stdin by default) with a run's best checkpoint.",
    )
    p.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'")
    p.add_argument("--input", "-i", help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", "-o", help="output file (default: stdout)")
    p.add_argument("--nbest", type=_positive_int, help="write the N best translations as 'INDEX<TAB>TEXT' lines")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from nmt.openmp import limit_spinning

    limit_spinning()  # before anything imports torch, which loads the OpenMP runtime
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
