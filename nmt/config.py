"""Typed configuration: the YAML file's values (read by ``nmt.config_sources``) are checked once,
here, into dataclasses.

Every error names the key (``train.lr_peak``) and, for unknown keys, the closest
known one. Code below the CLI receives these objects, never raw dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.config_checks import check_consistency, check_corpus_formats, check_training
from nmt.config_sources import apply_overrides, error_cause, file_place, file_values_set_into, read_yaml
from nmt.corpus import anchor_corpus
from nmt.corpus_spec import CorpusConfig, absolute_path
from nmt.errors import NMTError
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
    workers: int | None = None  # processes encoding shards; default: one per CPU the process may use (its affinity)


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
    run_dir = absolute_path(base_for("run_dir"), Path(cfg.run_dir).expanduser())
    return dataclasses.replace(cfg, run_dir=run_dir, data=data)


def config_from_dict(
    values: dict, base_dir: Path | None = None, command_line: set[str] = frozenset(), training: bool = True
) -> Config:
    """Build and check a Config. With ``base_dir``, relative paths are resolved against it
    (``command_line`` keys against the working directory; see ``anchor_paths``). ``training``:
    also check the settings only training reads (``nmt.config_checks.check_training``)."""
    if not isinstance(values, dict):
        raise NMTError("config: the top level must be a mapping of sections")
    cfg = _SCHEMA.build(Config, values, "")
    check_consistency(cfg)
    if training:
        check_training(cfg)
    if base_dir is not None:
        cfg = anchor_paths(cfg, base_dir, command_line)
    check_corpus_formats(cfg)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None, training: bool = True) -> Config:
    """Read a YAML config, apply ``--set`` overrides, check everything once.

    Relative paths in the file are read against the file's directory; those given with ``--set``
    against the working directory. The Config holds them absolute. ``training=False`` reads a
    run's own config to use what it trained: settings only training reads are not checked.
    """
    path, overrides = Path(path), overrides or []
    values = read_yaml(path)
    _check_values_set_into(path, values, overrides)
    command_line = apply_overrides(values, overrides)
    try:
        return config_from_dict(values, path.absolute().parent, command_line, training)
    except NMTError as e:
        source = error_cause(str(e), path, overrides, lambda some: _error_with(path, some, training))
        raise NMTError(f"{source}: {e}") from None


def _check_values_set_into(path: Path, values: dict, overrides: list[str]) -> None:
    """The error the file alone gives for a section of it that is no mapping (``decode: [1, 2]``), also
    where a --set writes a key into it (``decode.beam_size=5``), which would replace the section."""
    for key, value in file_values_set_into(values, overrides):
        alone: Any = value
        for part in reversed(key.split(".")):
            alone = {part: alone}
        try:
            _SCHEMA.build(Config, alone, "")
        except NMTError as e:
            raise NMTError(f"{file_place(str(e), path)}: {e}") from None


def _error_with(path: Path, overrides: list[str], training: bool) -> str | None:
    """The check's error for the file with these of its --set overrides (all of which apply), or None."""
    values = read_yaml(path)
    command_line = apply_overrides(values, overrides)
    try:
        config_from_dict(values, path.absolute().parent, command_line, training)
    except NMTError as e:
        return str(e)
    return None


def check_with_place(
    check: Callable[[Config], None], cfg: Config, path: str | Path | None, overrides: list[str] | None
) -> None:
    """``check(cfg)``, a check of a loaded config that only some commands ask (this machine's device,
    a new run's scoring), its error saying where the value came from as load_config's do: the --set,
    else the file's line. ``path`` None (a config built in code): the error as it is."""
    try:
        check(cfg)
    except NMTError as e:
        if path is None:
            raise
        path, overrides = Path(path), overrides or []
        source = error_cause(str(e), path, overrides, lambda some: _check_error_with(check, path, some))
        raise NMTError(f"{source}: {e}") from None


def _check_error_with(check: Callable[[Config], None], path: Path, overrides: list[str]) -> str | None:
    """``check``'s error for the file with these of its --set overrides, or None."""
    try:
        check(load_config(path, overrides))
    except NMTError as e:
        return str(e)
    return None


def check_on_this_machine(cfg: Config, path: str | Path, overrides: list[str]) -> None:
    """``train.device`` and ``train.precision`` against this machine (no GPU, no bf16 kernels), which
    only a command that trains here asks."""
    check_with_place(_check_device, cfg, path, overrides)


def _check_device(cfg: Config) -> None:
    from nmt.device import check_train_device

    check_train_device(cfg.train.device, cfg.train.precision, cfg.train.cpu_fallback)


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
    return header + yaml.safe_dump(values, sort_keys=False, allow_unicode=True)  # a path as written, not \xFC
