"""nmt's decoder against the same model exported to CTranslate2, in one process and one sitting.

    python scripts/ct2_compare.py RUN_DIR [--src data/multi30k/test_2016_flickr.de --ref ...en] [--repeats 5]
        [--threads N]   (default: the cores this process may run on)

1. Greedy, fp32: how many lines of ``nmt translate`` and CTranslate2 are identical (CTranslate2
   called once per max output length, so each sentence gets nmt's limit floor(a * src_len + b);
   and, for reference, once for all with the largest limit).
2. Beam 5: sacreBLEU of both (nmt fp32 and auto precision, CTranslate2 fp32 and int8, with
   ``nmt.export.ctranslate2_options``, i.e. patience 2, and with CTranslate2's default patience 1).
3. Beam-5 speed, sentences/s, all with the same threads: every configuration decodes the whole
   set ``--repeats`` times, round-robin (a shared machine's load then falls on all alike), and
   the median is reported. The BLEU pass before is each one's untimed warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from nmt import export  # noqa: E402
from nmt.arg_types import positive_int, user_path  # noqa: E402
from nmt.config import DecodeConfig  # noqa: E402
from nmt.corpus import read_lines  # noqa: E402
from nmt.errors import NMTError  # noqa: E402
from nmt.machine import cpu_model_and_flags, usable_cpus  # noqa: E402
from nmt.rundir import RunDir  # noqa: E402
from nmt.scoring import corpus_scores  # noqa: E402
from nmt.translate import load_translator  # noqa: E402


def cpu_name() -> str:
    model, _, flags = cpu_model_and_flags()
    units = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return f"{model} [{' '.join(units) or 'no AVX-512'}]"


def compared_decodings(decode: DecodeConfig) -> tuple[DecodeConfig, DecodeConfig]:
    """Beam 5 and greedy with the run's other decoding settings, one hypothesis per line: the
    comparison scores and matches the best (a run whose decode.nbest is above 1 would otherwise ask
    greedy for more hypotheses than its beam holds)."""
    one = replace(decode, nbest=1)
    return replace(one, beam_size=5), replace(one, beam_size=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=user_path)
    parser.add_argument("--src", type=user_path, default=ROOT / "data/multi30k/test_2016_flickr.de")
    parser.add_argument("--ref", type=user_path, default=ROOT / "data/multi30k/test_2016_flickr.en")
    # Both decoders get the same threads; 2 was this one machine's cores, a literal on any other.
    parser.add_argument(
        "--threads", type=positive_int, default=usable_cpus(), help="threads of both (default: the cores)"
    )
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--json", type=user_path, help="also write the results here")
    args = parser.parse_args()
    ct2 = export.import_ctranslate2()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    src, ref = read_lines(args.src), read_lines(args.ref)
    run = RunDir.existing(args.run_dir)
    decode = run.config().decode
    beam, greedy = compared_decodings(decode)
    nmt32 = load_translator(run, "cpu", "fp32")
    nmt_auto = load_translator(run, "cpu", None, log)
    torch.set_num_threads(args.threads)  # after load_translator, which applies the run's choice
    tmp = tempfile.TemporaryDirectory()
    model_dir = export.export_run(args.run_dir, Path(tmp.name) / "ct2", log=log)
    ct2_32 = ct2.Translator(str(model_dir), compute_type="float32", intra_threads=args.threads)
    ct2_8 = ct2.Translator(str(model_dir), compute_type="int8", intra_threads=args.threads)
    toks = nmt32.src_tok, nmt32.trg_tok
    # CTranslate2 batches as nmt does: up to batch_tokens source tokens per batch.
    batching = {"max_batch_size": decode.batch_tokens, "batch_type": "tokens"}

    def nmt_run(translator, d):
        return lambda: [h[0] for h in translator.translate(src, d)]

    max_positions = run.config().model.max_positions

    def ct2_run(translator, d, group=True, **kw):
        return lambda: export.translate_lines(
            translator, *toks, src, d, group, max_positions=max_positions, **batching, **kw
        )

    results: dict = {"cpu": cpu_name(), "threads": args.threads, "sentences": len(src), "torch": torch.__version__}
    results["ctranslate2"] = ct2.__version__
    results["nmt_auto_precision"] = nmt_auto.precision.name

    ours = nmt_run(nmt32, greedy)()
    for name, group in (("grouped", True), ("one_call", False)):
        theirs = ct2_run(ct2_32, greedy, group)()
        same = sum(a == b for a, b in zip(ours, theirs))
        results[f"greedy_fp32_identical_{name}"] = same
        log(f"greedy fp32, CTranslate2 {name}: {same}/{len(src)} lines identical ({100 * same / len(src):.1f}%)")

    # name -> (run, timed). "as nmt": nmt's options (patience 2) and per-sentence limits (one call per
    # limit); "one call": the same options in one call with the largest limit, as a CTranslate2 user
    # calls it; "patience 1": CTranslate2's default beam stopping.
    configs = {
        "nmt fp32": (nmt_run(nmt32, beam), True),
        f"nmt auto ({nmt_auto.precision.name})": (nmt_run(nmt_auto, beam), True),
        "ct2 fp32, as nmt": (ct2_run(ct2_32, beam), False),
        "ct2 fp32, one call": (ct2_run(ct2_32, beam, False), True),
        "ct2 int8, one call": (ct2_run(ct2_8, beam, False), True),
        "ct2 fp32, one call, patience 1": (ct2_run(ct2_32, beam, False, patience=1), True),
        "ct2 int8, one call, patience 1": (ct2_run(ct2_8, beam, False, patience=1), True),
    }
    hyps = {name: run() for name, (run, _) in configs.items()}  # also the warm-up
    results["bleu_beam5"] = {name: round(corpus_scores(h, [ref]).bleu, 2) for name, h in hyps.items()}
    same = {n: sum(a == b for a, b in zip(hyps["nmt fp32"], h)) for n, h in hyps.items()}
    results["beam5_identical_to_nmt_fp32"] = same
    log(f"beam 5 BLEU: {results['bleu_beam5']}")
    log(f"beam 5 lines identical to nmt fp32: {same}")

    timed = {name: run for name, (run, t) in configs.items() if t}
    seconds: dict[str, list[float]] = {name: [] for name in timed}
    for rep in range(args.repeats):
        for name, run in timed.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
        log(f"repeat {rep + 1}: " + ", ".join(f"{n} {len(src) / s[-1]:.1f}" for n, s in seconds.items()))
    speed = {name: round(len(src) / statistics.median(s), 1) for name, s in seconds.items()}
    results["beam5_sentences_per_s_median"] = speed
    results["beam5_sentences_per_s_all"] = {n: [round(len(src) / x, 1) for x in s] for n, s in seconds.items()}
    base = speed["nmt fp32"]
    results["speed_vs_nmt_fp32"] = {name: round(v / base, 2) for name, v in speed.items()}

    print(f"\n{results['cpu']}, {args.threads} threads, {len(src)} sentences, beam 5, median of {args.repeats}")
    print("| decoder | BLEU | lines = nmt fp32 | sentences/s | vs nmt fp32 |\n| --- | ---: | ---: | ---: | ---: |")
    for name in configs:
        figures = f"{speed[name]:.1f} | {speed[name] / base:.2f}x" if name in speed else "- | -"
        print(f"| {name} | {results['bleu_beam5'][name]:.2f} | {same[name]} | {figures} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NMTError as e:  # a config, key, file or run that is not right: one line, as nmt's commands say it
        print(f"ct2_compare: error: {e}", file=sys.stderr)
        sys.exit(2)
