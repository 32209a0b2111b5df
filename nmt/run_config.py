"""Whether a config fits the run it trains or reads: the run's saved config.yaml (its header says
'nmt train' wrote it), what may not change on resume (``check_resumable``), a new run's scoring, the
corpora a saved config names by absolute path (``check_saved_corpora``), and the decoding
'nmt tune-decode' chose for the run (tune_decode.json, kept on resume by ``kept_tuned_decode``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from nmt.config import Config, CorpusConfig, check_with_place, config_to_dict
from nmt.config_checks import check_case_folding_scoring, check_held_out_corpora
from nmt.config_sources import file_place, read_yaml, set_giving
from nmt.corpus import local_corpus_gone
from nmt.errors import NMTError
from nmt.models import same_model_value
from nmt.synthetic import META_FILE, corpus_directory

CONFIG_HEADER = "# The resolved config of this run, written by 'nmt train' (every default filled in).\n"

# Sections whose change makes a checkpoint unusable; everything else may change on resume.
_FROZEN_SECTIONS = ("model", "tokenizer")
_FROZEN_DATA_KEYS = ("src_lang", "trg_lang")
# What dev BLEU is measured with: the best checkpoints (keep_best, the averaged model's standing) and the
# patience count compare every validation's score, and scores measured two ways do not compare.
# Validation's output stops at max_len_a * source length + max_len_b, greedy or not.
_DEV_SCORE_KEYS = (
    ("decode", "bleu_tokenize"),
    ("decode", "bleu_lowercase"),
    ("decode", "max_len_a"),
    ("decode", "max_len_b"),
    ("train", "validate_beam_size"),
    ("train", "validate_max_sentences"),
)


def empty_saved_corpus(config_file: Path, split: str, problem: str) -> NMTError:
    """The error for a corpus the run's saved config names at data.SPLIT that holds no pair to read
    (``problem`` says how), at the line of its path in ``config_file``: the file may have been
    emptied since the run trained on it."""
    message = f"config key 'data.{split}.path': {problem}"
    return NMTError(f"{file_place(message, config_file)}: {message}")


def written_by_nmt(path: Path) -> bool:
    """Whether ``path`` begins with ``CONFIG_HEADER``: a run's config.yaml that 'nmt train' wrote."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline() == CONFIG_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def config_differences(old: Config, new: Config, sections: tuple[str, ...], data_keys: tuple[str, ...]) -> list[str]:
    """'section.key: old -> new' for every key of ``sections`` and ``data.<data_keys>`` that differs."""
    a, b = config_to_dict(old), config_to_dict(new)
    diffs = []
    for section in sections:
        for key in sorted(set(a[section]) | set(b[section])):
            was, is_ = a[section].get(key), b[section].get(key)
            if not (same_model_value(key, was, is_) if section == "model" else was == is_):
                diffs.append(f"{section}.{key}: {was!r} -> {is_!r}")
    for key in data_keys:
        if a["data"][key] != b["data"][key]:
            diffs.append(f"data.{key}: {a['data'][key]!r} -> {b['data'][key]!r}")
    return diffs


def check_resumable(old: Config, new: Config) -> None:
    """Refuse a config whose model or vocabulary differs from the one the run was trained with, or
    that measures dev BLEU otherwise than the validations the run has ranked."""
    diffs = config_differences(old, new, _FROZEN_SECTIONS, _FROZEN_DATA_KEYS)
    if diffs:
        raise NMTError(
            "cannot resume: the config changed what the checkpoint was trained with ("
            + "; ".join(diffs)
            + "); use a new run_dir"
        )
    a, b = config_to_dict(old), config_to_dict(new)
    scoring = [
        f"{section}.{key}: {a[section][key]!r} -> {b[section][key]!r}"
        for section, key in _DEV_SCORE_KEYS
        if a[section][key] != b[section][key]
    ]
    if scoring:
        raise NMTError(
            "cannot resume: the config changed how dev BLEU is measured ("
            + "; ".join(scoring)
            + "), and the run's best checkpoints and patience count rank scores measured the old way: "
            "resume with the old value, or use a new run_dir"
        )


def check_new_run_scoring(cfg: Config, config_file: Path | None, overrides: list[str] | None = None) -> None:
    """``check_case_folding_scoring`` and ``check_held_out_corpora`` for a run that has ranked no
    scores yet, naming the config file's line or the --set that gave the value: a run already
    trained resumes on the data it started with."""
    check_with_place(_new_run_scoring, cfg, config_file, overrides)


def _new_run_scoring(cfg: Config) -> None:
    check_case_folding_scoring(cfg)
    check_held_out_corpora(cfg)


def check_saved_corpora(
    cfg: Config, config_file: Path, splits: tuple[str, ...], fix: str = "", overrides: list[str] | None = None
) -> None:
    """Refuse, saying how to give their new place, the corpora of ``splits`` that a run's saved
    config.yaml (``config_file``) names by absolute path where nothing is now: the project was
    moved, or copied to another machine. ``fix`` is the command to give it to (empty: the one run now,
    whose ``--set`` may be added). A corpus path among the command line's ``overrides`` is the
    user's own, as is any other config's missing corpus: for the reader to report.

    With data.synthetic the corpus is written into data.train's directory before it is read: there
    only where that directory holds its meta.json (a generation to complete), else it would be
    written again at a place the user no longer works in (the project moved)."""
    if not written_by_nmt(config_file):
        return
    try:
        saved = read_yaml(config_file).get("data")
    except NMTError:
        return
    if not isinstance(saved, dict):
        return
    d = cfg.data
    gone = []
    for split in ("train", "dev", "test"):
        spec: CorpusConfig | None = getattr(d, split)
        path_key = f"data.{split}.path"
        if spec is None or set_giving(path_key, overrides or []) is not None:
            continue  # given on the command line (itself, or within a section given whole)
        named_there = isinstance(saved.get(split), dict) and saved[split].get("path") == spec.path
        if named_there and local_corpus_gone(spec, d.src_lang, d.trg_lang) and not _synthetic_under_way(cfg, spec):
            gone.append(split)
    needed = [split for split in gone if split in splits]
    if not needed:
        return
    sets = " ".join(f"--set data.{s}.path=NEW_DIR/{Path(getattr(d, s).path).name}" for s in gone)
    where = f"with '{fix} {sets}'" if fix else f"with {sets}"
    problem = f"config key 'data.{needed[0]}.path': no corpus at {getattr(d, needed[0]).path}"
    missing = f"{file_place(problem, config_file)}: {problem}, which this run's saved config names by absolute path"
    if d.synthetic:
        raise NMTError(
            f"{missing}, and data.synthetic writes it only where a config or --set names it anew: give the "
            f"synthetic corpus's new place, or where to write it, {where}"
        )
    raise NMTError(f"{missing}: if the data moved, give its new place {where}")


def _synthetic_under_way(cfg: Config, spec: CorpusConfig) -> bool:
    """Whether data.synthetic completes ``spec`` where it is: it lies in the corpus directory, which
    holds the meta.json a generation cut off midway leaves."""
    if not cfg.data.synthetic:
        return False
    directory = corpus_directory(cfg.data.train.path)
    return Path(spec.path).parent == directory and (directory / META_FILE).is_file()


def _tune_report(report: Path) -> dict | None:
    """A tune_decode.json as written, or None where there is none (or none readable)."""
    try:
        tuned = json.loads(report.read_text())
    except (OSError, ValueError):  # never tuned
        return None
    return tuned if isinstance(tuned, dict) else None


def tuned_decode_report(report: Path) -> tuple[dict, dict] | None:
    """The "chosen" and "before" decoding of a tune_decode.json, or None where there is none."""
    return _chosen_and_before(_tune_report(report) or {})


def _chosen_and_before(tuned: dict) -> tuple[dict, dict] | None:
    try:
        chosen, before = dict(tuned["chosen"]), dict(tuned["before"])
    except (KeyError, TypeError, ValueError):  # never tuned, or by a version without "before"
        return None
    if not all(key in pair for pair in (chosen, before) for key in ("beam_size", "length_penalty")):
        return None
    return chosen, before


def tuned_checkpoint(report: Path) -> tuple[dict, str, str | None] | None:
    """The "chosen" pair of a tune_decode.json, the checkpoint it was tuned with and that file's
    SHA-256 as tuning found it; None where the report names no checkpoint (never tuned, or by an
    earlier version)."""
    recorded = _tune_report(report) or {}
    tuned, name, digest = _chosen_and_before(recorded), recorded.get("checkpoint"), recorded.get("checkpoint_sha256")
    if tuned is None or not isinstance(name, str):
        return None
    return tuned[0], name, digest if isinstance(digest, str) else None


def kept_tuned_decode(new: Config, saved: Config, report: Path, log: Callable[[str], None]) -> Config:
    """``new``, but with the beam size and length penalty 'nmt tune-decode' chose (its ``report``,
    tune_decode.json) where ``new`` only repeats the values they replaced: resuming with the config
    the run started from keeps the tuned decoding. A value of its own replaces them, with a warning, and so
    does a ``decode.nbest`` above the tuned beam (that pair would be an invalid config)."""
    tuned = tuned_decode_report(report)
    if tuned is None:
        return new
    chosen, before = tuned
    keys = ("beam_size", "length_penalty")
    now = {k: getattr(new.decode, k) for k in keys}
    in_force = {k: getattr(saved.decode, k) for k in keys}
    if in_force != {k: chosen[k] for k in keys} or now == in_force:
        return new
    if now == {k: before[k] for k in keys}:
        if new.decode.nbest > in_force["beam_size"]:  # the tuned beam cannot give this config's n-best lists
            log(
                f"warning: keeping the config's decode beam {now['beam_size']}, length penalty "
                f"{now['length_penalty']}, not what 'nmt tune-decode' chose ({in_force['beam_size']}, "
                f"{in_force['length_penalty']}): its decode.nbest {new.decode.nbest} is more than that beam"
            )
            return new
        tuned_text = f"beam {chosen['beam_size']}, length penalty {chosen['length_penalty']}"
        log(f"decode: keeping {tuned_text} ('nmt tune-decode')")
        return replace(new, decode=replace(new.decode, **in_force))
    log(
        f"warning: the config's decode beam {now['beam_size']}, length penalty {now['length_penalty']} replaces "
        f"what 'nmt tune-decode' chose ({in_force['beam_size']}, {in_force['length_penalty']}); run it again to re-tune"
    )
    return new
