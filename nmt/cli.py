"""The ``nmt`` command: its arguments, and the dispatch to ``nmt.commands``; nothing else lives here."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import Any

from nmt import commands
from nmt.arg_types import int_at_least, non_negative_float, non_negative_int, positive_int, user_path
from nmt.console import say
from nmt.errors import NMTError
from nmt.files import storage_error, write_error_message
from nmt.versions import check_dependencies

# one checkpoint's average would only copy it (as train.average_last, >= 2)
_checkpoint_count = int_at_least(2, "checkpoints to average")


def _length_penalty(text: str) -> float:
    from nmt.config import MAX_LENGTH_PENALTY  # here: the module imports torch, which must load after limit_spinning

    value = non_negative_float(text)
    if value > MAX_LENGTH_PENALTY:
        raise argparse.ArgumentTypeError(f"expected a number in [0, {MAX_LENGTH_PENALTY:g}], got {text!r}")
    return value


def _max_len_b(text: str) -> int:
    from nmt.config import MAX_LEN_B

    value = non_negative_int(text)
    if value > MAX_LEN_B:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {MAX_LEN_B}], got {text!r}")
    return value


def _number_list(number: Callable[[str], Any]):
    """Comma-separated values, each read by ``number`` (a type of nmt.arg_types or one above)."""

    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",")]
        if not all(items):  # '1,,2' or '1,2,': a value left out, not a list to shorten silently
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r} (an empty item)")
        return [number(x) for x in items]

    return parse


def _add_decode_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding (defaults come from the run's config)")
    g.add_argument("--beam-size", type=positive_int, help="beam width; 1 is greedy search")
    g.add_argument("--length-penalty", type=_length_penalty, help="alpha in score / length**alpha")
    g.add_argument(
        "--max-len-a",
        type=non_negative_float,
        help="max output length = a * source length + b (at most the model's positions)",
    )
    g.add_argument("--max-len-b", type=_max_len_b, help="see --max-len-a")
    g.add_argument("--batch-tokens", type=positive_int, help="source tokens per decoding batch")
    # No argparse defaults for these two: eval-bleu --hyp must see whether they were given.
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where to decode (default auto)")
    _add_checkpoint_option(g)
    g.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], help="default: the run's train.precision")


def _add_checkpoint_option(p: argparse._ActionsContainer) -> None:
    """--checkpoint, worded alike in every command that reads a run's model (translate, eval-bleu,
    tune-decode). No argparse default: "" is no checkpoint, not auto (cmd_translate)."""
    p.add_argument(
        "--checkpoint",
        metavar="WHICH",
        help="auto (default: the averaged model where its dev BLEU beats the best, else the best), best, "
        "average, last, or a file name in RUN_DIR/checkpoints",
    )


def _add_config_options(p: argparse.ArgumentParser, config_help: str = "YAML config file (see configs/)") -> None:
    p.add_argument("--config", type=user_path, required=True, help=config_help)
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
    p.set_defaults(func=commands.cmd_train)

    p = sub.add_parser(
        "prepare",
        help="tokenize and binarize the training data into the run directory (train does it too)",
        description="Train or reuse SentencePiece and encode the training corpus into memory-mappable shards, "
        "using data.workers processes. An interrupted preparation resumes; 'nmt train' then starts at once.",
    )
    _add_config_options(p)
    p.set_defaults(func=commands.cmd_prepare)

    p = sub.add_parser(
        "average",
        help="average a run's last N checkpoints (kept; used by default where dev BLEU says it helps)",
        description="Average the model weights of the run's last N training-state checkpoints, score the "
        "average on the dev set and keep it as checkpoints/average_last_N.pt.",
    )
    p.add_argument(
        "--model", type=user_path, required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'"
    )
    p.add_argument(
        "--last", type=_checkpoint_count, required=True, help="how many of the latest checkpoints (at least 2)"
    )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to score it")
    p.set_defaults(func=commands.cmd_average)


def _translate_parsers(sub) -> None:
    p = sub.add_parser(
        "translate",
        help="translate text with a trained run",
        description="Translate lines of text (stdin by default) with a run's averaged model where its dev BLEU "
        "beats the best checkpoint's, else the best checkpoint (--checkpoint chooses another).",
    )
    p.add_argument(
        "--model", type=user_path, required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'"
    )
    p.add_argument("--input", "-i", type=user_path, help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", "-o", type=user_path, help="output file (default: stdout)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="translate each line of stdin alone, as soon as it is read (stdin is otherwise translated in "
        "windows of what has arrived: a line typed at a terminal is answered at once anyway)",
    )
    p.add_argument(
        "--attention",
        type=user_path,
        metavar="DIR",
        help="also write each line's attention map: DIR/NNNNN.png (heatmap) and DIR/NNNNN.json (all weights)",
    )
    p.add_argument("--attention-layer", help="decoder layer to show (default -1, the last), or 'mean'")
    p.add_argument("--attention-head", help="attention head to show, or 'mean' (default)")
    p.add_argument(
        "--nbest",
        type=positive_int,
        help="write the N best translations of each line as Moses/Marian n-best lines: "
        "'INDEX ||| TEXT ||| F0= LOGPROB ||| SCORE' (SCORE = LOGPROB / length**length_penalty); "
        "default: the run's decode.nbest; 1: plain text, the best translation of each line",
    )
    _add_decode_options(p)
    p.set_defaults(func=commands.cmd_translate)

    p = sub.add_parser(
        "eval-bleu",
        help="corpus BLEU and chrF with sacreBLEU",
        description="Score a hypothesis file (or a run's translation of --src) against references.",
    )
    p.add_argument("--hyp", type=user_path, help="hypothesis file, one detokenized sentence per line (- for stdin)")
    p.add_argument(
        "--ref", type=user_path, action="append", required=True, help="reference file (repeat for several references)"
    )
    p.add_argument("--model", type=user_path, metavar="RUN_DIR", help="translate --src with this run, then score")
    p.add_argument("--src", type=user_path, help="source file to translate (with --model)")
    p.add_argument("--output", "-o", type=user_path, help="with --model: also write the translations here")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    p.add_argument(
        "--tokenize",
        metavar="TOKENIZER",
        help="sacreBLEU's BLEU tokenizer (zh, ja-mecab, ko-mecab or char for languages written without "
        "spaces); default: with --model the run's decode.bleu_tokenize, else 13a",
    )
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        help="case-insensitive BLEU and chrF; default: with --model the run's decode.bleu_lowercase, else cased",
    )
    _add_decode_options(p)
    p.set_defaults(func=commands.cmd_eval_bleu)


BEAM_SIZES = (1, 2, 4, 5, 8)  # tune-decode's grid
LENGTH_PENALTIES = (0.0, 0.6, 0.8, 1.0, 1.2, 1.5)


def _tune_parser(sub) -> None:
    p = sub.add_parser(
        "tune-decode",
        help="choose beam size and length penalty on the dev set; written into the run's config",
        description="Translate the run's dev set with every beam size and length penalty given, keep the pair "
        "with the best dev BLEU in RUN_DIR/config.yaml (decode section) and the grid in RUN_DIR/tune_decode.json.",
    )
    p.add_argument(
        "--model", type=user_path, required=True, metavar="RUN_DIR", help="run directory written by 'nmt train'"
    )
    beams, penalties = ",".join(map(str, BEAM_SIZES)), ",".join(map(str, LENGTH_PENALTIES))
    p.add_argument("--beam-sizes", type=_number_list(positive_int), default=list(BEAM_SIZES), help=f"default {beams}")
    p.add_argument(
        "--length-penalties",
        type=_number_list(_length_penalty),
        default=list(LENGTH_PENALTIES),
        help=f"default {penalties}",
    )
    _add_checkpoint_option(p)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to decode")
    p.set_defaults(func=commands.cmd_tune_decode)


def _report_parsers(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure training tokens/s, decoding sentences/s and the matmul peak",
        description="Benchmark a config: real training updates on its data, decoding of its test set, "
        "and the matrix-multiply peak of the same device and precision, in one run.",
    )
    _add_config_options(p, "YAML config whose data and model to use")
    p.add_argument(
        "--model",
        type=user_path,
        metavar="RUN_DIR",
        help="trained run to decode with, as 'nmt translate' does: device auto, the run's precision and kernels "
        "(--set train.device or train.precision overrides them; default: the untrained model)",
    )
    p.add_argument("--updates", type=positive_int, default=30, help="timed training updates (default 30)")
    p.add_argument("--warmup", type=positive_int, default=5, help="untimed updates first (default 5)")
    p.add_argument("--decode-sentences", type=positive_int, help="decode only the first N test sentences")
    p.add_argument("--json", type=user_path, metavar="FILE", help="write the report here (default: stdout)")
    p.set_defaults(func=commands.cmd_bench)

    p = sub.add_parser(
        "compare",
        help="finished runs side by side: Markdown table and dev-BLEU curves (PNG)",
        description="Summarise finished runs: model, parameters, training time and speed, dev BLEU over wall "
        "time and updates, test BLEU/chrF (each run decoded with its config's decode section: what "
        "'nmt tune-decode' chose, where it was run) and decoding speed (greedy and beam 5, every run alike).",
    )
    p.add_argument("runs", type=user_path, nargs="+", metavar="RUN_DIR", help="run directories written by 'nmt train'")
    p.add_argument("--out", type=user_path, default="report", help="output directory (default: report)")
    p.set_defaults(func=commands.cmd_compare)

    p = sub.add_parser(
        "plot",
        help="PNG curves of runs (loss, dev BLEU, learning rate, gradient norm, tokens/s), also while training",
        description="Draw each scalar of metrics.jsonl against updates and against wall time, runs overlaid: "
        "training loss, dev loss, perplexity and BLEU, learning rate, gradient norm, target tokens/s. "
        "Writes one PNG per scalar and index.md.",
    )
    p.add_argument("runs", type=user_path, nargs="+", metavar="RUN_DIR", help="run directories written by 'nmt train'")
    p.add_argument("--out", type=user_path, required=True, metavar="DIR", help="output directory (created if missing)")
    p.set_defaults(func=commands.cmd_plot)


def _deploy_parsers(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a trained Transformer as a CTranslate2 model (pip install 'nmt[export]')",
        description="Export the model 'nmt translate' loads by default (the run's averaged model where its dev "
        "BLEU beats the best checkpoint's, else the best checkpoint) to an inference engine's format, with its "
        "SentencePiece model(s) and a README; OUT_DIR must be new or empty.",
    )
    p.add_argument("--format", required=True, choices=["ctranslate2"], help="target format")
    p.add_argument("--quantization", help="CTranslate2 weight type, e.g. int8 (default: float32)")
    p.add_argument("run_dir", type=user_path, metavar="RUN_DIR", help="run directory written by 'nmt train'")
    p.add_argument("out_dir", type=user_path, metavar="OUT_DIR", help="output directory (must not hold files)")
    p.set_defaults(func=commands.cmd_export)


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
    _tune_parser(sub)
    _report_parsers(sub)
    _deploy_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from nmt.openmp import limit_spinning
    from nmt.signals import end_with_torchrun

    end_with_torchrun()  # first: a torchrun killed from now on takes this rank with it
    limit_spinning()  # before anything imports torch, which loads the OpenMP runtime
    parser = build_parser()
    args = parser.parse_args(argv)
    code = _run(args)
    # Only where the command imported it: a signal in the middle of importing torch (torchrun's SIGTERM
    # as a rank starts) leaves a torch that cannot be imported again, which ended in a traceback.
    if args.command == "train" and "nmt.distributed" in sys.modules:
        from nmt import distributed

        if distributed.world_from_environment().enabled:  # a torchrun rank: see exit_rank
            distributed.exit_rank(code)
    return code


# What to lower when a command runs out of memory.
MEMORY_OPTIONS = {
    # Not train.validate_beam_size: a resume with another is refused (dev BLEU would be measured two ways).
    "train": "a smaller train.max_tokens (a larger train.accumulate keeps the batch size) or decode.batch_tokens",
    "prepare": "a smaller data.shard_pairs or data.workers",
    "translate": "a smaller --batch-tokens or --beam-size",
    "eval-bleu": "a smaller --batch-tokens or --beam-size",
    "tune-decode": "smaller --beam-sizes, or a smaller decode.batch_tokens in the run's config.yaml",
    "average": "a smaller decode.batch_tokens in the run's config.yaml",
    "bench": "a smaller train.max_tokens or decode.batch_tokens (--set)",
    "compare": "a smaller decode.batch_tokens in the runs' config.yaml",
}


# oneDNN's whole message where it cannot make a kernel it has chosen: it then has no memory for the kernel's
# code or scratch space (found no implementation is "could not create a primitive descriptor ...").
ONEDNN_NO_MEMORY = "could not create a primitive"


def out_of_memory(error: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError (CUDA), or the RuntimeError of torch's CPU allocator or oneDNN."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in message or "can't allocate memory" in message or message.strip() == ONEDNN_NO_MEMORY
    )


def out_of_memory_message(command: str, error: BaseException) -> str:
    """One line: what ran out, how much was asked for where the error says, and what to lower."""
    asked = re.search(r"[Tt]ried to allocate (\d+ bytes|[\d.]+ [KMGTP]iB)", str(error))
    size = f" (tried to allocate {asked.group(1)})" if asked else ""
    advice = MEMORY_OPTIONS.get(command)
    return f"out of memory{size}" + (f": try {advice}" if advice else "")


# What running a command again after an interruption does, where it is more than starting over.
AFTER_INTERRUPT = {"prepare": "; run it again to go on: it keeps the shards it finished"}


def _another_rank_says_it(command: str) -> bool:
    """Whether this is a torchrun rank of ``nmt train`` other than rank 0, which says that the job was
    interrupted (torchrun passes a signal to every rank). Read from the environment, not with
    ``nmt.distributed``: the signal may have come as torch was imported, which then cannot be again."""
    try:
        world_size, rank = int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)
    except ValueError:
        return False
    return command == "train" and world_size > 1 and rank > 0


def _run(args: argparse.Namespace) -> int:
    from nmt.signals import sigterm_interrupts

    try:
        with sigterm_interrupts():  # ``kill`` stops any command as Ctrl-C does: its clean-up runs
            check_dependencies()
            return args.func(args)
    except NMTError as e:
        message = str(e).replace("\n", " ")
        if not message and hasattr(e, "wait_for_report"):  # a torchrun rank: another one reports it
            message = e.wait_for_report()
        if message:
            say(f"nmt {args.command}: error: {message}")
        return getattr(e, "exit_code", 2)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        say(f"nmt {args.command}: error: {out_of_memory_message(args.command, e)}")
        return 2
    except KeyboardInterrupt as e:
        if not _another_rank_says_it(args.command):
            say(f"nmt {args.command}: interrupted" + AFTER_INTERRUPT.get(args.command, ""))
        return 128 + getattr(e, "signum", signal.SIGINT)
    except BrokenPipeError:
        return 0
    except OSError as e:  # a write the storage refused where no command says more (nmt.files)
        if not storage_error(e):
            raise
        say(f"nmt {args.command}: error: {write_error_message(e)}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
