"""Typed configuration: the YAML file's values (read by ``nmt.config_sources``) are checked once,
here, into dataclasses.

Every error names the key (``train.lr_peak``) and, for unknown keys, the closest
known one. Code below the CLI receives these objects, never raw dicts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.config_sources import apply_overrides, error_source, read_yaml
from nmt.corpus import anchor_corpus, resolve_format
from nmt.corpus_spec import CorpusConfig, hf_keys_changed
from nmt.errors import NMTError
from nmt.hf_corpus import check_local_revision, check_saved_config, check_saved_split
from nmt.models import MODEL_CONFIGS, ModelConfig, TransformerConfig
from nmt.schema import Schema, quoting_hint
from nmt.tokenizer import TokenizerConfig


@dataclass
class DataConfig:
    src_lang: str = "de"
    trg_lang: str = "en"
    train: CorpusConfig = field(default_factory=CorpusConfig)
    dev: CorpusConfig = field(default_factory=CorpusConfig)
    test: CorpusConfig | None = None
    max_len: int = 128  # subword tokens per side; longer training pairs are dropped
    max_len_ratio: float = 3.0  # drop training pairs whose subword length ratio exceeds this
    synthetic: bool = False  # generate the built-in synthetic corpus into the paths above first
    synthetic_seed: int = 1
    synthetic_train_pairs: int = 6000
    shard_pairs: int = 100_000  # training pairs per binarized shard (one encoding task each)
    workers: int | None = None  # processes encoding shards; default: one per CPU core


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # padded tokens per batch: sentences x max(src_len, trg_len), as fairseq
    accumulate: int = 1  # batches per update
    lr_peak: float = 7e-4
    lr_min: float = 0.0
    warmup_updates: int = 1000
    schedule: Literal["inverse_sqrt", "cosine", "linear", "constant"] = "inverse_sqrt"
    decay_updates: int | None = None  # length of cosine/linear decay; default max_updates, else max_minutes
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables clipping
    max_updates: int | None = None
    max_epochs: int | None = None
    max_minutes: float | None = None
    validate_every: int = 1000  # updates
    validate_beam_size: int = 1  # 1: greedy dev BLEU, cheap
    validate_max_sentences: int | None = None  # score dev BLEU on a prefix of the dev set
    # validations without a new best before stopping; best: higher dev BLEU, or equal with a lower dev loss
    patience: int | None = None
    keep_last: int = 2  # training-state checkpoints kept (one per validation; one a signal wrote comes on top)
    keep_best: int = 1  # the N best validations' models kept, a new best or not, ranked as patience ranks them
    average_last: int | None = None  # at the end, average the last N checkpoints; kept where dev says it helps
    log_every: int = 50
    tensorboard: bool = False  # also write the metrics as TensorBoard events (pip install 'nmt[tensorboard]')
    # auto: measured at start-up on this machine with this model's shapes (nmt/autotune.py), then cached;
    # attention and fp32_matmul are measured for training and for decoding apart
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    attention: Literal["auto", "sdpa", "explicit"] = "auto"  # fused SDPA kernel or softmax(QK^T)V in two matmuls
    fp32_matmul: Literal["auto", "blas", "onednn"] = "auto"  # library of fp32 CPU products (LSTM: output layer only)
    threads: int | Literal["auto"] | None = "auto"  # torch intra-op threads on CPU; null means auto
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cpu_fallback: bool = False  # device 'cuda' without a GPU: run on CPU with a warning instead of failing
    compile: bool = False
    max_nonfinite: int = 5  # consecutive non-finite updates tolerated before stopping (fp16 overflows: see trainer)


# sacreBLEU 2.3's tokenizers (flores101 and flores200 download their SentencePiece model once)
BleuTokenizer = Literal["13a", "none", "zh", "intl", "char", "ja-mecab", "ko-mecab", "flores101", "flores200"]


@dataclass
class DecodeConfig:
    beam_size: int = 5
    length_penalty: float = 1.0  # score / length**alpha
    max_len_a: float = 1.2  # max output length = a * src_len + b
    max_len_b: int = 10
    batch_tokens: int = 8192  # source tokens per decoding batch
    nbest: int = 1
    # sacreBLEU's tokenizer for BLEU (dev BLEU, eval-bleu, compare, tune-decode): 13a suits languages
    # written with spaces; zh, ja-mecab, ko-mecab or char for those without, where 13a scores near 0
    bleu_tokenize: BleuTokenizer = "13a"
    bleu_lowercase: bool = False  # case-insensitive BLEU and chrF


def check_beam_size(beam_size: int, vocab_size: int, name: str) -> None:
    """Beam sizes are capped at the target vocabulary's size: the first step has no more distinct
    hypotheses than words to fill a beam with, and a huge beam exhausts memory before the search
    starts. ``name`` is the option or config key the error names."""
    if beam_size > vocab_size:
        raise NMTError(
            f"{name} {beam_size} is more than the {vocab_size} words of the target vocabulary: "
            f"give at most {vocab_size}"
        )


@dataclass
class Config:
    name: str = "run"
    run_dir: str = "runs/run"
    seed: int = 1
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=TransformerConfig)  # the class model.type names
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# Range checks: key -> (predicate, description). Types are checked from the annotations.
# Beyond these, length**alpha and a * src + b leave float and int64 range; nobody decodes near them.
MAX_LENGTH_PENALTY = 10.0
MAX_LEN_B = 1 << 31
_POSITIVE = (lambda v: v > 0, "must be > 0")
_NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
_PROBABILITY = (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)")
_TORCH_SEED = (lambda v: -(2**63) <= v <= 2**64 - 1, "must be in [-2**63, 2**64 - 1] (what torch.manual_seed accepts)")
# Model widths multiply in torch's int64 tensor sizes (d_model x ff_size, 4 gates x rnn_hidden**2, bytes):
# two int32 widths overflow them. 2**24 keeps every product far inside; real models are far narrower.
MAX_WIDTH = 1 << 24
_WIDTH = (lambda v: 0 < v <= MAX_WIDTH, f"must be in [1, {MAX_WIDTH}]")
# Thread counts: SentencePiece refuses more than 1024, and libgomp fails past the system's thread
# limit (20,000 threads: "Thread creation failed", exit 1; 100,000: a segfault), so train.threads
# shares the bound; a config may still name more threads than the machine's cores.
MAX_THREADS = 1024
# Layers are built one Python module at a time: 10**5 of them ran a 23 GB machine out of memory, and
# 2**31 never finished building. 1024 per side leaves room for the deepest published models.
MAX_LAYERS = 1024
# The synthetic corpus is drawn and deduplicated in memory (300 bytes and 22 us a pair): 2**31
# pairs would run for 13 hours; 10**8 take 30 GB and 40 minutes.
MAX_SYNTHETIC_PAIRS = 10**8
_LAYERS = (lambda v: 0 < v <= MAX_LAYERS, f"must be in [1, {MAX_LAYERS}]")
# SentencePiece: 0 reads every sentence; a sample needs more than 100; the field is a uint64.
_SENTENCE_SAMPLE = (
    lambda v: v == 0 or 100 < v <= 2**64 - 1,
    "must be 0 (every sentence) or in [101, 2**64 - 1] (SentencePiece samples more than 100)",
)
_RANGES: dict[str, tuple[Any, str]] = {
    "seed": _TORCH_SEED,
    "data.max_len": _POSITIVE,
    # the filter compares max(src/trg, trg/src), never below 1: a smaller bound drops every pair
    "data.max_len_ratio": (lambda v: v >= 1.0, "must be >= 1"),
    "data.synthetic_train_pairs": (lambda v: 0 < v <= MAX_SYNTHETIC_PAIRS, f"must be in [1, {MAX_SYNTHETIC_PAIRS}]"),
    "data.shard_pairs": _POSITIVE,
    "data.workers": _POSITIVE,
    # a negative count would slice ("all but the last n"), not limit
    "data.train.max_pairs": _POSITIVE,
    "data.dev.max_pairs": _POSITIVE,
    "data.test.max_pairs": _POSITIVE,
    # SentencePiece's unigram trainer spins without end near 2**31 (1 s at 2**30); real vocabularies are < 2**20
    "tokenizer.vocab_size": (lambda v: 16 <= v <= MAX_WIDTH, f"must be in [16, {MAX_WIDTH}]"),
    # SentencePiece's trainer refuses anything below 0.98 (a CHECK failure, not a message)
    "tokenizer.character_coverage": (lambda v: 0.98 <= v <= 1.0, "must be in [0.98, 1] (what SentencePiece accepts)"),
    "tokenizer.input_sentence_size": _SENTENCE_SAMPLE,
    "tokenizer.threads": (lambda v: 1 <= v <= MAX_THREADS, "must be in [1, 1024] (what SentencePiece accepts)"),
    "model.d_model": _WIDTH,
    "model.ff_size": _WIDTH,
    "model.encoder_layers": _LAYERS,
    "model.decoder_layers": _LAYERS,
    "model.heads": _POSITIVE,
    "model.dropout": _PROBABILITY,
    "model.attention_dropout": _PROBABILITY,
    "model.activation_dropout": _PROBABILITY,
    "model.max_positions": _WIDTH,
    "model.rnn_hidden": _WIDTH,
    "train.max_tokens": _POSITIVE,
    "train.accumulate": _POSITIVE,
    "train.lr_peak": _POSITIVE,
    "train.lr_min": _NON_NEGATIVE,
    "train.warmup_updates": _NON_NEGATIVE,
    "train.decay_updates": _POSITIVE,
    "train.betas": (lambda v: all(0.0 <= b < 1.0 for b in v), "must be two numbers in [0, 1)"),
    "train.adam_eps": _POSITIVE,
    "train.weight_decay": _NON_NEGATIVE,
    "train.label_smoothing": _PROBABILITY,
    "train.clip_norm": _NON_NEGATIVE,
    "train.max_updates": _POSITIVE,
    "train.max_epochs": _POSITIVE,
    "train.max_minutes": _POSITIVE,
    "train.validate_every": _POSITIVE,
    "train.validate_beam_size": _POSITIVE,
    "train.validate_max_sentences": _POSITIVE,
    "train.patience": _POSITIVE,
    "train.keep_last": _POSITIVE,
    "train.keep_best": _POSITIVE,
    "train.average_last": (lambda v: v >= 2, "must be >= 2 (checkpoints to average)"),
    "train.log_every": _POSITIVE,
    "train.threads": (lambda v: v == "auto" or 0 < v <= MAX_THREADS, f"must be auto or in [1, {MAX_THREADS}]"),
    "train.max_nonfinite": _POSITIVE,
    "decode.beam_size": _POSITIVE,
    "decode.length_penalty": (lambda v: 0 <= v <= MAX_LENGTH_PENALTY, f"must be in [0, {MAX_LENGTH_PENALTY:g}]"),
    "decode.max_len_a": _NON_NEGATIVE,
    "decode.max_len_b": (lambda v: 0 <= v <= MAX_LEN_B, f"must be in [0, {MAX_LEN_B}]"),
    "decode.batch_tokens": _POSITIVE,
    "decode.nbest": _POSITIVE,
}

# Integer keys exempt from the 32-bit bound: seeds (torch's range, or Python's random: any), corpus
# sizes (Python slices; a corpus may hold over 2**31 pairs), and keys whose range check bounds them.
_WIDE_INTS = frozenset(
    {
        "seed",
        "data.synthetic_seed",
        "data.train.max_pairs",
        "data.dev.max_pairs",
        "data.test.max_pairs",
        "tokenizer.input_sentence_size",
        "decode.max_len_b",
    }
)


def _model_section(schema: Schema, values: Any, key: str) -> ModelConfig:
    """The ``model:`` mapping as the config class its ``type`` names (Transformer by default).

    A key that belongs to the other model type is accepted only at its default value: saved
    configs of earlier versions list every model key. Set to anything else, it would be ignored
    silently, so it is an error.
    """
    if not isinstance(values, dict):
        raise NMTError(f"config key '{key}': expected a mapping, got {values!r}")
    kind = values.get("type", "transformer")
    if not isinstance(kind, str) or kind not in MODEL_CONFIGS:  # a list or mapping cannot be looked up
        names = ", ".join(repr(k) for k in MODEL_CONFIGS)
        raise NMTError(f"config key '{key}.type': {kind!r} is not one of {names}")
    kept = {}
    for name, value in values.items():
        other = _other_model_default(kind, name)
        if other is None:
            kept[name] = value  # its own key, or an unknown one that _build reports with a suggestion
        elif value != other[1]:
            raise NMTError(f"config key '{key}.{name}': applies to model.type '{other[0]}', not '{kind}'")
    return schema.build(MODEL_CONFIGS[kind], kept, key)


def _other_model_default(kind: str, name: str) -> tuple[str, Any] | None:
    """(model type, default) when ``name`` is a key of another model type only, else None."""
    if name in {f.name for f in dataclasses.fields(MODEL_CONFIGS[kind])}:
        return None
    for other_kind, cls in MODEL_CONFIGS.items():
        for f in dataclasses.fields(cls):
            if f.name == name:
                return other_kind, f.default
    return None


def _corpus(schema: Schema, value: Any, key: str) -> CorpusConfig:
    """A corpus mapping, or the shorthand ``train: data/train`` for a plain-file prefix."""
    if isinstance(value, str):
        value = {"path": value}
    if not isinstance(value, dict):
        raise NMTError(f"config key '{key}': expected a path or a mapping, got {value!r}{quoting_hint(value)}")
    return schema.build(CorpusConfig, value, key)


_SCHEMA = Schema(_RANGES, {ModelConfig: _model_section, CorpusConfig: _corpus}, _WIDE_INTS)


def _check_consistency(cfg: Config) -> None:
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


def _check_training(cfg: Config) -> None:
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


def _check_corpus_formats(cfg: Config) -> None:
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


def anchor_paths(cfg: Config, base: Path, command_line: set[str] = frozenset()) -> Config:
    """``cfg`` with every relative path made absolute: against ``base`` (the config file's
    directory), or against the working directory for keys in ``command_line`` (``--set``)."""
    cwd = Path.cwd()

    def base_for(key: str) -> Path:
        # Given itself or within a section given whole; a --set of a sibling (data.train.max_pairs)
        # leaves the path the file's.
        return cwd if any(key == k or key.startswith(k + ".") for k in command_line) else base

    d = cfg.data
    anchored = {}
    for split in ("train", "dev", "test"):
        if (spec := getattr(d, split)) is None:
            continue
        try:
            anchored[split] = anchor_corpus(spec, base_for(f"data.{split}.path"), d.src_lang, d.trg_lang)
        except NMTError as e:  # the key says whether the path came from the file or a --set
            raise NMTError(f"config key 'data.{split}': {e}") from None
    data = dataclasses.replace(d, **anchored)
    run_dir = Path(cfg.run_dir).expanduser()
    if not run_dir.is_absolute():
        run_dir = base_for("run_dir") / run_dir
    return dataclasses.replace(cfg, run_dir=str(Path(os.path.normpath(run_dir.absolute()))), data=data)


def config_from_dict(
    values: dict, base_dir: Path | None = None, command_line: set[str] = frozenset(), training: bool = True
) -> Config:
    """Build and check a Config. With ``base_dir``, relative paths are resolved against it
    (``command_line`` keys against the working directory; see ``anchor_paths``). ``training``:
    also check the settings only training reads (``_check_training``)."""
    if not isinstance(values, dict):
        raise NMTError("config: the top level must be a mapping of sections")
    cfg = _SCHEMA.build(Config, values, "")
    _check_consistency(cfg)
    if training:
        _check_training(cfg)
    if base_dir is not None:
        cfg = anchor_paths(cfg, base_dir, command_line)
    _check_corpus_formats(cfg)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None, training: bool = True) -> Config:
    """Read a YAML config, apply ``--set`` overrides, check everything once.

    Relative paths in the file are read against the file's directory; those given with ``--set``
    against the working directory. The Config holds them absolute. ``training=False`` reads a
    run's own config to use what it trained: settings only training reads are not checked.
    """
    path, overrides = Path(path), overrides or []
    values = read_yaml(path)
    command_line = apply_overrides(values, overrides)
    try:
        return config_from_dict(values, path.absolute().parent, command_line, training)
    except NMTError as e:
        raise NMTError(f"{_cause(str(e), path, overrides, training)}: {e}") from None


def _error_with(path: Path, overrides: list[str], training: bool) -> str | None:
    """The check's error for the file with these of its --set overrides (all of which apply), or None."""
    values = read_yaml(path)
    command_line = apply_overrides(values, overrides)
    try:
        config_from_dict(values, path.absolute().parent, command_line, training)
    except NMTError as e:
        return str(e)
    return None


def _cause(message: str, path: Path, overrides: list[str], training: bool) -> str:
    """Where the error ``message`` comes from: the --set that gave the key it names (``error_source``),
    else the file, unless the file alone is free of it. Then a --set caused it through another key
    (``model.d_model=90`` against the file's 4 heads: the error names ``model.heads``): the ones that
    cause it on their own are named with the file, or every --set where none does alone."""
    source = error_source(message, path, overrides)
    if source != str(path) or not overrides or _error_with(path, [], training) == message:
        return source
    alone = [text for text in overrides if _error_with(path, [text], training) == message]
    return f"{path} with " + ", ".join(f"--set {text}" for text in alone or overrides)


def config_to_dict(cfg: Config) -> dict:
    def clean(v: Any) -> Any:
        if isinstance(v, tuple):
            return [clean(x) for x in v]
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return clean(dataclasses.asdict(cfg))


def config_yaml(cfg: Config, run_dir: str | None = None, header: str = "") -> str:
    """The config as YAML, every default filled in; ``run_dir`` replaces the stored run directory
    (a run's own config says ``.``: the directory it lies in)."""
    values = config_to_dict(cfg)
    if run_dir is not None:
        values["run_dir"] = run_dir
    return header + yaml.safe_dump(values, sort_keys=False)
