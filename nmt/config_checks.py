"""The checks across keys of a typed config: what no single key's type or range can say (tied
embeddings need a joint vocabulary, warmup within the updates, a hub dataset's keys on a hub
dataset only). ``nmt.config`` runs them once the sections are built; each error names the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nmt.corpus import check_corpus_exists, resolve_format
from nmt.corpus_spec import CorpusConfig, hf_keys_changed
from nmt.errors import NMTError
from nmt.hf_corpus import check_local_revision, check_saved_config, check_saved_split
from nmt.models import TransformerConfig
from nmt.synthetic import corpus_directory

if TYPE_CHECKING:
    from nmt.config import Config


def check_beam_size(beam_size: int, vocab_size: int, name: str) -> None:
    """Beam sizes are capped at the target vocabulary's size: the first step has no more distinct
    hypotheses than words to fill a beam with, and a huge beam exhausts memory before the search
    starts. ``name`` is the option or config key the error names."""
    if beam_size > vocab_size:
        raise NMTError(
            f"{name} {beam_size} is more than the {vocab_size} words of the target vocabulary: "
            f"give at most {vocab_size}"
        )


def check_consistency(cfg: Config) -> None:
    """What a run needs to be built, read and decoded with: checked for every config."""
    cfg.model.check()
    if cfg.model.tie_embeddings and not cfg.tokenizer.joint:
        raise NMTError("config key 'model.tie_embeddings': needs 'tokenizer.joint: true' (one shared vocabulary)")
    if not cfg.run_dir:  # Path("") is the working directory: the run would fill it
        raise NMTError("config key 'run_dir': empty: name the run's directory")
    if not cfg.data.train.path:
        raise NMTError("config key 'data.train': no training corpus given")
    if not cfg.data.dev.path:
        raise NMTError("config key 'data.dev': no dev corpus given")
    if cfg.data.test is not None and not cfg.data.test.path:
        raise NMTError("config key 'data.test': the corpus path is empty (null or no key means no test set)")
    for key, beam_size in (
        ("decode.beam_size", cfg.decode.beam_size),
        ("train.validate_beam_size", cfg.train.validate_beam_size),  # nmt average validates too
    ):
        check_beam_size(beam_size, cfg.tokenizer.vocab_size, f"config key '{key}':")
    if cfg.decode.nbest > cfg.decode.beam_size:
        raise NMTError(
            f"config key 'decode.nbest': {cfg.decode.nbest} is more than decode.beam_size {cfg.decode.beam_size}"
        )
    if cfg.data.src_lang == cfg.data.trg_lang:
        raise NMTError("config key 'data.trg_lang': source and target language are the same")


def check_training(cfg: Config) -> None:
    """Settings only training reads. A run's own config.yaml is read without these checks: an
    earlier version may have trained it with a value they refuse now, and the run must still
    translate, export and be scored; training with that config is still refused."""
    m, t = cfg.model, cfg.train
    # A training pair of max_len subwords takes max_len + 1 positions (EOS on the source, BOS on the
    # decoder input). Sinusoids are computed for any length, but decoding and export stop at
    # max_positions: a model trained on longer pairs could not translate them.
    if isinstance(m, TransformerConfig) and m.max_positions <= cfg.data.max_len:
        raise NMTError(
            f"config key 'model.max_positions': {m.max_positions} must exceed data.max_len {cfg.data.max_len} "
            f"(a pair of {cfg.data.max_len} subwords plus its BOS/EOS needs {cfg.data.max_len + 1} positions; "
            f"translation stops at {m.max_positions})"
        )
    if not isinstance(m, TransformerConfig) and t.attention != "auto":  # it would be ignored
        raise NMTError(
            f"config key 'train.attention': {t.attention} chooses the Transformer's attention kernel; "
            f"model.type '{m.type}' has none to choose (leave it auto)"
        )
    # torch.compile failed on the RNN's decoder: with 2 or more decoder layers and dropout (the shipped
    # RNN configs) inductor stopped the first update with a traceback (InductorError: Exponent must be
    # non-negative), and where it compiled, the step loop (one Python step per target position) took
    # about 90 s per batch shape on 2 CPU cores, the first updates 50x slower than eager.
    if t.compile and m.type == "rnn":
        raise NMTError(
            "config key 'train.compile': not for model.type 'rnn' (torch.compile fails on its decoder's "
            "step loop, or takes minutes per batch shape); set train.compile: false"
        )
    if t.max_updates is None and t.max_epochs is None and t.max_minutes is None:
        raise NMTError("config key 'train.max_updates': set at least one of max_updates, max_epochs, max_minutes")
    if t.max_updates is not None and t.warmup_updates > t.max_updates:
        raise NMTError(
            f"config key 'train.warmup_updates': {t.warmup_updates} exceeds train.max_updates {t.max_updates}"
        )
    if t.decay_updates is not None and t.schedule not in ("cosine", "linear"):  # it would be ignored
        raise NMTError(
            f"config key 'train.decay_updates': schedule '{t.schedule}' does not use it (cosine and linear do)"
        )
    if t.lr_min > 0 and t.schedule == "constant":
        raise NMTError("config key 'train.lr_min': schedule 'constant' stays at lr_peak after warmup, never at lr_min")
    if t.decay_updates is not None and t.warmup_updates > t.decay_updates:  # the decay would end before it starts
        raise NMTError(
            f"config key 'train.warmup_updates': {t.warmup_updates} exceeds train.decay_updates {t.decay_updates}"
        )
    if t.lr_min > t.lr_peak:  # the schedules decay from lr_peak down to lr_min
        raise NMTError(f"config key 'train.lr_min': {t.lr_min} exceeds train.lr_peak {t.lr_peak}")
    if t.average_last is not None and t.average_last > t.keep_last:
        raise NMTError(
            f"config key 'train.average_last': {t.average_last} needs train.keep_last >= {t.average_last} "
            f"(it is {t.keep_last}): the run must keep the checkpoints it averages"
        )
    if t.schedule in ("cosine", "linear") and t.decay_updates is None and t.max_updates is None and not t.max_minutes:
        raise NMTError(
            f"config key 'train.decay_updates': schedule '{t.schedule}' needs decay_updates, max_updates or max_minutes"
        )


def check_case_folding_scoring(cfg: Config) -> None:
    """A case-folding rule makes the model write lower-case text: cased BLEU would then count every
    capital of the references as a miss, and choose best checkpoints and early stopping on that.
    Checked as a run starts (``RunDir.open_for_training``), not on resume: a run an earlier version
    began with cased dev BLEU keeps it, since a resume may not change how dev BLEU is measured."""
    if cfg.tokenizer.normalization.endswith("_cf") and not cfg.decode.bleu_lowercase:
        raise NMTError(
            f"config key 'decode.bleu_lowercase': tokenizer.normalization '{cfg.tokenizer.normalization}' "
            "lower-cases the translations; set it true so that dev BLEU and chrF ignore case"
        )


def check_held_out_corpora(cfg: Config) -> None:
    """A dev or test Hugging Face dataset that reads what ``data.train`` reads: the same dataset,
    configuration, revision and split. A ``split`` left out defaults to ``train``, so ``dev: DIR``
    on a saved DatasetDict, or a hub dataset named without ``split``, would silently rank the
    checkpoints (or score the run) on training pairs. Plain and TSV corpora name their files, so
    their sameness is the user's choice (a memorization check), not a key left out. Checked as a
    run starts: needs anchored paths."""
    d = cfg.data

    def format_of(spec: CorpusConfig) -> str | None:
        try:
            return resolve_format(spec, d.src_lang, d.trg_lang)
        except NMTError:  # no such corpus yet: reading it will say so
            return None

    if format_of(d.train) != "hf":
        return
    train = (d.train.path, d.train.hf_config, d.train.revision, d.train.split)
    for split in ("dev", "test"):
        spec = getattr(d, split)
        if spec is None or (spec.path, spec.hf_config, spec.revision, spec.split) != train or format_of(spec) != "hf":
            continue
        raise NMTError(
            f"config key 'data.{split}': reads split '{spec.split}' of {spec.path}, the same data as data.train, "
            f"so {split} scores would be measured on training pairs: name its own split "
            f"(data.{split}.split, e.g. validation or test) or dataset"
        )


def check_training_corpora(cfg: Config) -> None:
    """The local training and dev corpora there (``check_corpus_exists``), as a run starts: before
    any work, and where the error can name the line or --set that gave the path. Those data.synthetic
    writes into data.train's directory are checked once it has written them (``nmt.prepare``)."""
    d = cfg.data
    for split in ("train", "dev"):
        spec = getattr(d, split)
        if not (d.synthetic and Path(spec.path).parent == corpus_directory(d.train.path)):
            check_corpus_exists(spec, d.src_lang, d.trg_lang, f"data.{split}")


def check_corpus_formats(cfg: Config) -> None:
    """A Hugging Face dataset's keys on a plain or TSV corpus would be ignored: an error, as are a
    configuration named for a saved dataset and a split asked of one without splits. Saved configs
    list every key, so only a value other than the default counts. Needs anchored paths: format
    auto is resolved on the files."""
    d = cfg.data
    for split in ("train", "dev", "test"):
        spec = getattr(d, split)
        changed = [] if spec is None else hf_keys_changed(spec)
        if not changed:
            continue
        try:
            fmt = resolve_format(spec, d.src_lang, d.trg_lang)
        except NMTError:  # no such corpus (yet: data.synthetic writes it): reading it will say so
            continue
        if fmt != "hf":
            raise NMTError(
                f"config key 'data.{split}.{changed[0]}': applies to Hugging Face datasets (format hf) only, "
                f"not to this {fmt} corpus"
            )
        check_saved_config(spec, f"data.{split}.hf_config")
        check_saved_split(spec, f"data.{split}.split")
        check_local_revision(spec, f"data.{split}.revision")
