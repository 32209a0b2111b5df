"""``nmt compare``: finished runs side by side, as a Markdown table and one PNG figure
(dev BLEU over training wall time and over updates).

Each run's test score uses its own decoding settings (its config's ``decode``, which
``nmt tune-decode`` chose on dev where it was run), so a tuned system is scored as it translates;
decoding speed is timed at greedy and beam 5 for every run alike."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from nmt.corpus import read_parallel
from nmt.errors import NMTError
from nmt.files import atomic_write, atomic_write_bytes, check_distinct_runs, check_output_dir
from nmt.metrics import elapsed_at, read_metrics
from nmt.run_config import empty_saved_corpus
from nmt.rundir import RunDir
from nmt.scoring import check_run_bleu, corpus_scores
from nmt.streams import translate_lines


@dataclass
class RunSummary:
    name: str
    model_type: str
    parameters: int
    train_seconds: float
    updates: int
    trg_tokens_per_s: float
    curve: list[dict] = field(default_factory=list)  # validation records
    direction: str = ""  # "de->en"
    test_set: str = ""  # the config's data.test, as it names it
    test_digest: str = ""  # of its text (nmt.validation.dev_digest): the same sentences elsewhere compare
    test: dict = field(default_factory=dict)  # bleu, chrf, signatures
    test_decoding: str = ""  # the settings the test score was decoded with
    decode_sentences_per_s: dict = field(default_factory=dict)  # greedy, beam5
    # The last average training made (its "average" record: update, dev_bleu, updates) and "auto_takes":
    # the checkpoint test was decoded with, --checkpoint auto's choice between it and the best single one.
    average: dict | None = None


def summarize_run(run: RunDir, log: Callable[[str], None]) -> RunSummary:
    from nmt.translate import load_translator
    from nmt.validation import dev_digest

    run_dir = run.path
    averages: list[dict] = []
    train, valid = read_metrics(run_dir, averages=averages)
    if not train:
        raise NMTError(f"{run_dir}: the run has no training updates logged")
    writer = run.writer()
    if writer is not None:
        log(f"warning: {run_dir} is being written ({writer}): scored at the checkpoint it has now, not as finished")
    cfg = run.config_reading("test")
    translator = load_translator(run, decode=cfg.decode)  # the test set is decoded with the run's own pair
    seconds = train[-1]["elapsed"]
    summary = RunSummary(
        name=str(run_dir),
        model_type=cfg.model.type,
        parameters=translator.model.num_parameters(),
        train_seconds=seconds,
        updates=train[-1]["update"],
        trg_tokens_per_s=sum(r["trg_tokens"] for r in train) / max(seconds, 1e-9),
        curve=valid,
        direction=f"{cfg.data.src_lang}->{cfg.data.trg_lang}",
    )
    if averages:
        taken = translator.checkpoint.name if translator.checkpoint is not None else "-"
        summary.average = {**averages[-1], "auto_takes": taken}
        summary.average.pop("type", None)
    spec = cfg.data.test
    if spec is None:
        log(f"{run_dir}: no data.test in its config: test BLEU and decoding speed skipped")
        return summary
    # Every line, blank ones too, translated as eval-bleu --model translates them: the two
    # commands give the same score, sacreBLEU's, for the same run and test set.
    summary.test_set = spec.path
    src, ref = read_parallel(spec, cfg.data.src_lang, cfg.data.trg_lang)
    if not src:  # scoring named no file: "the hypothesis input: empty input"
        raise empty_saved_corpus(run.config_path, "test", f"the corpus '{spec.path}' holds no line: nothing to score")
    summary.test_digest = dev_digest(src, ref)
    own = replace(cfg.decode, nbest=1)
    test_hyps = None
    for label, beam in (("greedy", 1), ("beam5", 5)):
        settings = replace(own, beam_size=beam)
        start = time.perf_counter()
        hyps = translate_lines(translator, src, settings)
        summary.decode_sentences_per_s[label] = len(src) / (time.perf_counter() - start)
        if settings == own:
            test_hyps = hyps
    if test_hyps is None:
        test_hyps = translate_lines(translator, src, own)
    summary.test = corpus_scores(test_hyps, [ref], tokenize=own.bleu_tokenize, lowercase=own.bleu_lowercase).to_dict()
    summary.test_decoding = decoding_label(own.beam_size, own.length_penalty)
    log(
        f"{run_dir}: test BLEU {summary.test['bleu']:.2f} ({summary.test_decoding}), decoding "
        f"{summary.decode_sentences_per_s['greedy']:.1f} / {summary.decode_sentences_per_s['beam5']:.1f} sentences/s"
    )
    return summary


def decoding_label(beam_size: int, length_penalty: float) -> str:
    return "greedy" if beam_size == 1 else f"beam {beam_size}, lp {length_penalty:g}"


def markdown_table(runs: list[RunSummary]) -> str:
    averaged = any(r.average for r in runs)  # the columns only where a run has one: others' table is as before
    head = (
        "| run | model | parameters | training time | updates | target tokens/s | best dev BLEU "
        + "| average dev BLEU | auto takes " * averaged
        + "| test decoding | test BLEU | test chrF | greedy sent/s | beam-5 sent/s |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: "
        + "| ---: | --- " * averaged
        + "| --- | ---: | ---: | ---: | ---: |\n"
    )

    def number(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = []
    for r in runs:
        best = max((v["dev_bleu"] for v in r.curve), default=None)
        average = r.average or {}
        average_cells = f"| {number(average.get('dev_bleu'))} | {average.get('auto_takes', '-')} " * averaged
        rows.append(
            f"| {r.name} | {r.model_type} | {r.parameters / 1e6:.2f}M | {r.train_seconds / 60:.1f} min | {r.updates} "
            f"| {r.trg_tokens_per_s:.0f} | {number(best)} {average_cells}"
            f"| {r.test_decoding or '-'} | {number(r.test.get('bleu'))} "
            f"| {number(r.test.get('chrf'))} | {number(r.decode_sentences_per_s.get('greedy'), 1)} "
            f"| {number(r.decode_sentences_per_s.get('beam5'), 1)} |"
        )
    signature = next((r.test["bleu_signature"] for r in runs if r.test), None)
    foot = (
        f"\nTest scores: sacreBLEU, each run decoded with its own settings (its config's decode section);"
        f" BLEU signature `{signature}`.\n"
        if signature
        else ""
    )
    if averaged:
        foot += (
            "\nAverage dev BLEU: the model training averaged from its last checkpoints as it ended "
            "(`train.average_last`), scored on dev as its validations; auto takes: the checkpoint test was decoded "
            "with (`--checkpoint auto`: the average where its dev BLEU beats the best single checkpoint's, else the "
            "best).\n"
        )
    return head + "\n".join(rows) + "\n" + foot


def _record(run: RunSummary) -> dict:
    """What compare.json holds of ``run``: a run without an average is recorded as before averages were."""
    return {key: value for key, value in run.__dict__.items() if key != "average" or value is not None}


def _not_comparable(runs: list[RunSummary]) -> str:
    """A line saying so where the runs translate different directions or test sets, or score BLEU
    differently (``decode.bleu_tokenize``, ``decode.bleu_lowercase``): their scores do not compare.
    A test set is its text, not its path: each run's copy of the same files compares."""
    scored = [r for r in runs if r.test]
    kinds = {(r.direction, r.test_digest, r.test["bleu_signature"]) for r in scored}
    if len(kinds) < 2:
        return ""
    each = "; ".join(f"{r.name}: {r.direction}, {r.test_set}, {r.test['bleu_signature']}" for r in scored)
    why = "the runs translate different directions or test sets, or score BLEU differently"
    return f"\n**Not comparable:** {why} ({each}).\n"


def _pyplot():
    """matplotlib.pyplot (drawing off-screen), or the error naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise NMTError("the figure needs matplotlib: pip install 'nmt[report]'") from None
    return plt


def plot_curves(runs: list[RunSummary], path: Path) -> None:
    """dev BLEU over wall time and over updates, written atomically to ``path`` (PNG)."""
    plt = _pyplot()
    fig, (by_time, by_update) = plt.subplots(1, 2, figsize=(11, 4))
    for i, r in enumerate(runs):
        label, color = f"{r.name} ({r.model_type})", f"C{i % 10}"  # the default colours, kept by the stars
        for ax, x in ((by_time, [v["elapsed"] / 60 for v in r.curve]), (by_update, [v["update"] for v in r.curve])):
            ax.plot(x, [v["dev_bleu"] for v in r.curve], color=color, marker="o", label=label)
        if r.average:  # a star at the average training made, at the wall time of the validation it followed
            star = {"color": color, "marker": "*", "markersize": 11, "linestyle": "none", "label": f"{label}: average"}
            by_time.plot([elapsed_at(r.average["update"], r.curve) / 60], [r.average["dev_bleu"]], **star)
            by_update.plot([r.average["update"]], [r.average["dev_bleu"]], **star)
    by_time.set_xlabel("training wall time (minutes)")
    by_update.set_xlabel("updates")
    for ax in (by_time, by_update):
        ax.set_ylabel("dev BLEU")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)


def compare(run_dirs: list[Path], out_dir: Path, log: Callable[[str], None]) -> str:
    runs_opened = [RunDir.existing(d) for d in run_dirs]
    check_distinct_runs(run_dirs)
    _pyplot()  # a missing matplotlib is said before decoding every test set, not after
    for run in runs_opened:  # so is a run's BLEU tokenizer that cannot run here (ja-mecab without its extra)
        cfg = run.config()
        if cfg.data.test is not None:
            check_run_bleu(cfg.decode.bleu_tokenize, cfg.decode.bleu_lowercase, run.config_path)
    check_output_dir(out_dir, run_dirs)
    runs = [summarize_run(run, log) for run in runs_opened]
    not_comparable = _not_comparable(runs)
    if not_comparable:
        log(
            "warning: the runs translate different directions or test sets, or score BLEU differently; "
            "their test scores do not compare"
        )
    table = markdown_table(runs) + not_comparable
    figure = out_dir / "compare.png"
    plot_curves(runs, figure)
    atomic_write_bytes(out_dir / "compare.md", (table + f"\n![dev BLEU]({figure.name})\n").encode("utf-8"))
    atomic_write_bytes(out_dir / "compare.json", json.dumps([_record(r) for r in runs], indent=1).encode("utf-8"))
    log(f"wrote {out_dir / 'compare.md'}, {figure}")
    return table
