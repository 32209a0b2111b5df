"""Export a trained Transformer to CTranslate2, the inference engine OpenNMT, fairseq and Marian deploy with.

The model is written through CTranslate2's own specification API (``ctranslate2.specs``), so the
engine loads it like any converted model. How our Transformer maps onto that specification:

- Fused projections: our self-attention ``qkv`` (d -> 3d, rows q|k|v) is CTranslate2's
  ``linear[0]`` of a self-attention as it is; cross-attention ``q`` and fused ``kv`` are its
  ``linear[0]`` and ``linear[1]``; the output projection is the last ``linear``.
- Positions: CTranslate2's built-in sinusoids concatenate sin|cos halves and start at position 1;
  ours interleave sin/cos from position 0. So the encodings are always written as an explicit
  table (``max_positions`` rows): our sinusoidal table or the learned embedding, used as given.
- Embeddings are scaled by sqrt(d_model) (``scale_embeddings``), as ours; with tied embeddings or a
  tied output projection the shared matrix is written once (CTranslate2 aliases equal variables).
- Pre-norm gets the final encoder/decoder LayerNorm; post-norm has none. LayerNorm eps 1e-5.
- Vocabulary: the SentencePiece pieces in id order (pad=0, unk=1, bos=2, eos=3), one shared table
  for a joint model, else one per side. The source gets EOS appended and no BOS
  (``add_source_eos``); the decoder starts from BOS (``decoder_start_token``).

Decoding with our conventions needs a few ``translate_batch`` options (``ctranslate2_options``):
``return_end_token=True`` so that the length in score / length**alpha counts EOS as ours does,
``min_decoding_length=0`` so that EOS may come first, ``patience=2`` so that beam search stops about
as late as ours (by another rule: see ``ctranslate2_options``), ``max_input_length`` = max_positions
so that a long source is cut as ``nmt translate`` cuts it, and ``max_decoding_length`` =
min(floor(a * src_len + b), max_positions), which CTranslate2 takes per call, not per sentence
(``translate_lines`` groups by it). Past the table's max_positions rows CTranslate2 has no position
to read: a longer source or output is an error there, not a cut.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from nmt.config import DecodeConfig
from nmt.errors import NMTError
from nmt.models import ModelConfig, TransformerConfig
from nmt.search import MAX_STEPS
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
INSTALL_HINT = "pip install 'nmt[export]'"
PATIENCE = 2  # see ctranslate2_options


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
        import ctranslate2.specs  # noqa: F401 - the spec API must be there too
    except ImportError:
        raise NMTError(f"exporting to CTranslate2 needs the ctranslate2 package: {INSTALL_HINT}") from None
    return ctranslate2


def check_exportable(cfg: ModelConfig, quantization: str | None = None) -> None:
    if not isinstance(cfg, TransformerConfig):
        raise NMTError(f"model type '{cfg.type}' cannot be exported to CTranslate2: only Transformer runs can")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise NMTError(f"unknown quantization {quantization!r}: expected one of {', '.join(QUANTIZATIONS)}")


# ---------------------------------------------------------------------------- the specification


def _array(t: torch.Tensor):
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _set_linear(spec, layer: torch.nn.Linear) -> None:
    spec.weight = _array(layer.weight)
    if layer.bias is not None:
        spec.bias = _array(layer.bias)


def _set_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _position_table(model) -> torch.Tensor:
    """(max_positions, d): the learned embedding, or our interleaved sinusoids at positions 0.."""
    from nmt.models.transformer import sinusoidal_positions

    if model.pos_embed is not None:
        return model.pos_embed.weight
    return sinusoidal_positions(model.cfg.max_positions, model.d_model)


def _set_inputs(spec, embedding_spec, embedding: torch.nn.Embedding, positions) -> None:
    embedding_spec.weight = _array(embedding.weight)
    spec.scale_embeddings = True  # x sqrt(d_model)
    spec.position_encodings.encodings = positions


def build_spec(model, src_pieces: list[str], trg_pieces: list[str]):
    """A validated ``ctranslate2.specs.TransformerSpec`` holding the weights of ``model`` (a Transformer)."""
    from ctranslate2.specs import transformer_spec

    cfg: TransformerConfig = model.cfg
    pre = cfg.norm == "pre"
    encoder = transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, pre_norm=pre)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, pre_norm=pre)
    positions = _array(_position_table(model))
    _set_inputs(encoder, encoder.embeddings[0], model.src_embed, positions)
    _set_inputs(decoder, decoder.embeddings, model.trg_embed, positions)
    for spec, layer in zip(encoder.layer, model.encoder):
        _set_linear(spec.self_attention.linear[0], layer.attn.qkv)
        _set_linear(spec.self_attention.linear[1], layer.attn.out)
        _set_norm(spec.self_attention.layer_norm, layer.res_attn.norm)
        _set_ffn(spec.ffn, layer.ff, layer.res_ff.norm)
    for spec, layer in zip(decoder.layer, model.decoder):
        _set_linear(spec.self_attention.linear[0], layer.self_attn.qkv)
        _set_linear(spec.self_attention.linear[1], layer.self_attn.out)
        _set_norm(spec.self_attention.layer_norm, layer.res_self.norm)
        _set_linear(spec.attention.linear[0], layer.cross_attn.q)
        _set_linear(spec.attention.linear[1], layer.cross_attn.kv)
        _set_linear(spec.attention.linear[2], layer.cross_attn.out)
        _set_norm(spec.attention.layer_norm, layer.res_cross.norm)
        _set_ffn(spec.ffn, layer.ff, layer.res_ff.norm)
    if pre:
        _set_norm(encoder.layer_norm, model.encoder_norm)
        _set_norm(decoder.layer_norm, model.decoder_norm)
    projection = model.trg_embed.weight if model.out_proj is None else model.out_proj.weight
    decoder.projection.weight = _array(projection)  # no bias, as ours

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = 1e-5  # torch's default, which our LayerNorms use
    spec.config.unk_token = trg_pieces[UNK_ID]
    spec.config.bos_token = trg_pieces[BOS_ID]
    spec.config.eos_token = trg_pieces[EOS_ID]
    spec.config.decoder_start_token = trg_pieces[BOS_ID]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(trg_pieces)
    spec.validate()
    return spec


def _set_ffn(spec, ff, norm: torch.nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, ff.up)
    _set_linear(spec.linear_1, ff.down)
    _set_norm(spec.layer_norm, norm)


def vocabulary(tok: Tokenizer) -> list[str]:
    """The pieces of a SentencePiece model in id order; CTranslate2 maps tokens to ids through them."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tok.model_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(set(pieces)) != len(pieces):
        raise NMTError(f"{tok.model_path}: the SentencePiece model repeats a piece; CTranslate2 needs unique tokens")
    return pieces


# ---------------------------------------------------------------------------- writing a model directory


def export_ctranslate2(
    model,
    cfg: ModelConfig,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    out_dir: str | Path,
    quantization: str | None = None,
    decode: DecodeConfig | None = None,
) -> Path:
    """Write a CTranslate2 model directory for ``model`` (a Transformer, or its state_dict with ``cfg``).

    ``out_dir`` must not exist or be empty; the model is built in a temporary directory and moved
    into place (``_staging_dir``), so a failed export leaves nothing behind. The SentencePiece
    model(s) are copied along, with ``nmt_export.json`` (tokenizer files, special tokens, decoding
    options) and a README.
    """
    ctranslate2 = import_ctranslate2()
    check_exportable(cfg, quantization)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise NMTError(f"{out_dir}: already exists and is not an empty directory; choose a new output directory")
    try:  # before the conversion: a parent that is a file (OUT_DIR under a file) was a FileExistsError
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NMTError(f"{out_dir}: cannot create its directory {out_dir.parent} ({e.strerror or e})") from None
    if isinstance(model, dict):
        from nmt.models.transformer import Transformer

        state_dict, model = model, Transformer(cfg, src_tok.vocab_size, trg_tok.vocab_size, PAD_ID)
        model.load_state_dict(state_dict)
    joint = src_tok.model_path == trg_tok.model_path
    spec = build_spec(model, vocabulary(src_tok), vocabulary(trg_tok) if not joint else vocabulary(src_tok))
    spec.optimize(quantization=quantization)

    existing = out_dir.exists()  # an empty directory, checked above
    tmp = _staging_dir(out_dir, existing)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        spec.save(str(tmp))
        spm_files = _copy_tokenizers(src_tok, trg_tok, joint, tmp)
        info = _export_info(cfg, spm_files, spec.config, quantization, decode or DecodeConfig(), ctranslate2)
        (tmp / "nmt_export.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(_readme(info), encoding="utf-8")
        if existing:
            _move_into(tmp, out_dir)
        else:
            os.replace(tmp, out_dir)
    except OSError as e:
        raise NMTError(f"{out_dir}: could not write the exported model ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _staging_dir(out_dir: Path, existing: bool) -> Path:
    """Where the model is built before it is moved into ``out_dir``: beside a new ``out_dir``, renamed
    to it whole; inside an existing empty one, whose files are then renamed into it. The directory
    itself stays: a mount point (a container's volume), a symlink or ``.`` cannot be replaced, and
    its owner and permissions are the user's."""
    if existing:
        return out_dir / f".nmt-export.tmp{os.getpid()}"
    return out_dir.parent / f".{out_dir.name}.tmp{os.getpid()}"


def _move_into(tmp: Path, out_dir: Path) -> None:
    """Rename every file of ``tmp`` into ``out_dir`` (the same file system); where one fails, the
    ones already moved are removed again, so that ``out_dir`` is left empty as it was."""
    moved: list[Path] = []
    try:
        for entry in sorted(tmp.iterdir()):
            target = out_dir / entry.name
            os.replace(entry, target)
            moved.append(target)
    except OSError:
        for target in moved:
            target.unlink(missing_ok=True)
        raise


def _copy_tokenizers(src_tok: Tokenizer, trg_tok: Tokenizer, joint: bool, directory: Path) -> dict[str, str]:
    if joint:
        shutil.copyfile(src_tok.model_path, directory / "spm.model")
        return {"source": "spm.model", "target": "spm.model"}
    names = {"source": "source.spm.model", "target": "target.spm.model"}
    shutil.copyfile(src_tok.model_path, directory / names["source"])
    shutil.copyfile(trg_tok.model_path, directory / names["target"])
    return names


def ctranslate2_options(decode: DecodeConfig, max_positions: int | None = None) -> dict:
    """``translate_batch`` keyword arguments that decode as ``nmt translate`` does (bar the per-sentence
    max length: pass ``max_decoding_length`` from ``max_decoding_lengths`` per call, see ``translate_lines``).
    Without ``max_positions`` CTranslate2 keeps its own input limit (1,024 tokens)."""
    options = {
        "beam_size": decode.beam_size,
        "length_penalty": decode.length_penalty,
        "num_hypotheses": decode.nbest,
        "return_end_token": True,  # the length in score / length**alpha then counts EOS, as ours does
        "min_decoding_length": 0,  # EOS may come first, as in nmt
        # CTranslate2 stops a sentence at beam_size * patience finished hypotheses; ours at K, once its
        # best live beam's score so far (log p / length so far ** alpha) does not beat the K-th, which
        # bounds its continuations only for alpha 0 (see nmt.search.beam_search). So for alpha > 0
        # either search can stop before a higher-scoring hypothesis (CTranslate2's for any alpha).
        # With patience 1 CTranslate2 kept a lower-scoring one than ours on 64 of 1,000 Multi30k test
        # sentences (-0.36 BLEU), with 2 on 12 (-0.01 BLEU).
        "patience": PATIENCE,
    }
    if max_positions is not None:
        options["max_input_length"] = max_positions  # EOS included: CTranslate2 truncates and keeps EOS last
    return options


def _export_info(cfg: ModelConfig, spm_files: dict, config, quantization, decode: DecodeConfig, ct2) -> dict:
    return {
        "format": "ctranslate2",
        "ctranslate2_version": ct2.__version__,
        "quantization": quantization or "float32",
        "sentencepiece": spm_files,
        "special_tokens": {"unk": config.unk_token, "bos": config.bos_token, "eos": config.eos_token},
        "source": "SentencePiece pieces without BOS/EOS; CTranslate2 appends EOS",
        "model": {
            "norm": cfg.norm,
            "positions": cfg.positions,
            "max_positions": cfg.max_positions,
            "tie_embeddings": cfg.tie_embeddings,
            "tie_output": cfg.tie_output,
        },
        "decode": {
            "max_len_a": decode.max_len_a,
            "max_len_b": decode.max_len_b,
            "translate_batch": ctranslate2_options(decode, cfg.max_positions),
        },
    }


def _readme(info: dict) -> str:
    spm = info["sentencepiece"]
    options = ", ".join(f"{k}={v!r}" for k, v in info["decode"]["translate_batch"].items())
    a, b = info["decode"]["max_len_a"], info["decode"]["max_len_b"]
    positions = info["model"]["max_positions"]
    return f"""# CTranslate2 model exported by `nmt export`

```python
import math
import ctranslate2, sentencepiece as spm
src = spm.SentencePieceProcessor(model_file="{spm["source"]}")
trg = spm.SentencePieceProcessor(model_file="{spm["target"]}")
translator = ctranslate2.Translator(".", compute_type="default")  # or "int8"
pieces = [p[:{positions - 1}] for p in src.encode(["Ein Hund läuft."], out_type=str)]
limit = min({positions}, max(1, math.floor({a} * max(map(len, pieces)) + {b})))
results = translator.translate_batch(pieces, {options}, max_decoding_length=limit)
print(trg.decode([[p for p in r.hypotheses[0] if p != "{info["special_tokens"]["eos"]}"] for r in results]))
```

The model has {positions} positions, source and output alike; CTranslate2 raises an error for a
position past them. So, as `nmt translate` does, a source keeps its first {positions - 1} pieces (the
EOS CTranslate2 appends takes the last position; `max_input_length` makes the same cut), and an
output has at most floor({a} * source pieces + {b}) tokens, EOS included, source pieces counted
after the cut, and never more than {positions}. CTranslate2's `max_decoding_length` is one number
per call: group sentences by it to match `nmt translate` exactly.
`nmt_export.json` lists the tokenizer files, special tokens and decoding options.
"""


# ---------------------------------------------------------------------------- runs and decoding


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    quantization: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Export the checkpoint ``nmt translate`` would use (``checkpoint_choice.model_checkpoint``), checked against
    the run's config and tokenizer; reads the run only."""
    from nmt import checkpoint_choice
    from nmt.files import check_outside_runs
    from nmt.models import build_model
    from nmt.rundir import RunDir
    from nmt.tokenizer import load_tokenizers

    run = RunDir.existing(run_dir)
    check_outside_runs(Path(out_dir), [run.path], "OUT_DIR")  # a reader never writes in the run
    cfg = run.config()
    check_exportable(cfg.model, quantization)  # an RNN run: no install of the package would help
    import_ctranslate2()  # before any loading: a missing package is the next thing to say
    path = checkpoint_choice.model_checkpoint(run, cfg)
    src_tok, trg_tok = load_tokenizers(*run.tokenizer_paths(cfg))
    path, payload = checkpoint_choice.load_model_checkpoint(run, cfg, "auto", path)
    run.check_checkpoint(path, payload, cfg, build_model(cfg.model, src_tok.vocab_size, trg_tok.vocab_size, PAD_ID))
    out = export_ctranslate2(payload["model"], cfg.model, src_tok, trg_tok, out_dir, quantization, cfg.decode)
    if log is not None:
        log(f"exported {path} to {out} (CTranslate2, {quantization or 'float32'} weights)")
    return out


def max_decoding_lengths(src_lengths: list[int], decode: DecodeConfig, max_positions: int | None = None) -> list[int]:
    """floor(a * src_len + b) per sentence, at least 1 and at most ``max_positions`` (the decoder's
    positions): ``nmt.search.max_output_lengths`` in plain ints. ``src_lengths`` count the pieces the
    model reads, after any cut to its positions."""
    upper = MAX_STEPS if max_positions is None else min(max_positions, MAX_STEPS)
    return [min(upper, max(1, math.floor(decode.max_len_a * n + decode.max_len_b))) for n in src_lengths]


def translate_lines(
    translator,
    src_tok: Tokenizer,
    trg_tok: Tokenizer,
    lines: list[str],
    decode: DecodeConfig,
    group: bool = True,
    *,
    max_positions: int | None,
    **kw,
) -> list[str]:
    """Translate with a CTranslate2 ``translator`` as ``nmt translate`` would: same options, and with
    ``group`` one call per max output length so that each sentence gets its own limit (else one call
    with the largest). ``max_positions`` is the exported model's (``nmt_export.json``): a longer
    source is cut to its first max_positions - 1 pieces, as ``nmt translate`` cuts it (without its
    warning), and outputs stop at max_positions tokens. Extra keywords go to ``translate_batch``
    (e.g. ``max_batch_size``)."""
    from nmt.translate import max_source_length

    src_vocab, trg_vocab = vocabulary(src_tok), vocabulary(trg_tok)
    trg_ids = {piece: i for i, piece in enumerate(trg_vocab)}
    filled = [i for i, line in enumerate(lines) if line.strip()]
    max_src = max_source_length(max_positions)
    pieces = [[src_vocab[i] for i in ids[:max_src]] for ids in src_tok.encode([lines[i] for i in filled])]
    limits = max_decoding_lengths([len(p) for p in pieces], decode, max_positions)
    options = {**ctranslate2_options(decode, max_positions), **kw}
    out = [""] * len(lines)
    for limit in sorted(set(limits)) if group else [max(limits, default=1)]:
        rows = [r for r, n in enumerate(limits) if n == limit or not group]
        results = translator.translate_batch([pieces[r] for r in rows], max_decoding_length=limit, **options)
        hyps = [[trg_ids.get(p, UNK_ID) for p in res.hypotheses[0]] for res in results]  # decode drops EOS
        for r, text in zip(rows, trg_tok.decode(hyps)):
            out[filled[r]] = text
    return out
