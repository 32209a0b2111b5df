"""CTranslate2 export: for every Transformer option the project trains, the exported model decodes
token for token as ours and gives the same log-probabilities; runs export through the CLI;
what cannot be exported is a one-line error."""

import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import PAIRS, tiny_config

from nmt import checkpoint_file, export
from nmt.batching import make_batch
from nmt.cli import main
from nmt.config import DecodeConfig, TokenizerConfig
from nmt.errors import NMTError
from nmt.models import RNNConfig, TransformerConfig
from nmt.models.transformer import Transformer
from nmt.rundir import RunDir
from nmt.search import beam_search, greedy_search
from nmt.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.tokenizer_training import train_or_load_tokenizers

# The training pairs and unseen recombinations of their words.
SOURCES = [s for s, _ in PAIRS] + ["der kleine hund trinkt kaffee", "zwei katzen lesen", "die frau sieht den mann"]
MAX_LEN = 14

# (norm, positions, tie_embeddings, tie_output, joint); tied embeddings need one joint vocabulary.
BOOLS = [True, False]
COMBOS = [
    c for c in itertools.product(["pre", "post"], ["sinusoidal", "learned"], BOOLS, BOOLS, BOOLS) if c[4] or not c[2]
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models gain nothing from threads, and lose much on a busy machine (threads spin-wait)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def ct2():
    return pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spm")
    src, trg = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    return {
        joint: train_or_load_tokenizers(
            TokenizerConfig(type="bpe", vocab_size=60 if joint else 40, joint=joint),
            src,
            trg,
            tmp / str(joint) / ("spm.model" if joint else "spm.de.model"),
            tmp / str(joint) / ("spm.model" if joint else "spm.en.model"),
        )
        for joint in (True, False)
    }


def short_training(cfg: TransformerConfig, src_tok, trg_tok, steps: int = 40) -> Transformer:
    """A few Adam steps on the pairs, so that outputs depend on source and position (random weights
    repeat one token); then LayerNorm parameters and biases are jittered so that a misplaced one shows."""
    torch.manual_seed(0)
    model = Transformer(cfg, src_tok.vocab_size, trg_tok.vocab_size, PAD_ID)
    batch = make_batch(
        src_tok.encode([s for s, _ in PAIRS]),
        trg_tok.encode([t for _, t in PAIRS]),
        range(len(PAIRS)),
        PAD_ID,
        BOS_ID,
        EOS_ID,
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = model(batch.src, batch.src_mask, batch.trg_in)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.trg_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def source_batch(src_tok, lines):
    ids = src_tok.encode(lines)
    return ids, make_batch(ids, None, range(len(ids)), PAD_ID, BOS_ID, EOS_ID)


def ct2_ids(vocab, hypothesis):
    index = {p: i for i, p in enumerate(vocab)}
    ids = [index[p] for p in hypothesis]
    return ids[:-1] if ids and ids[-1] == EOS_ID else ids


@pytest.mark.parametrize("norm,positions,tie_embeddings,tie_output,joint", COMBOS)
def test_exported_model_decodes_and_scores_as_ours(
    ct2, tokenizers, tmp_path, norm, positions, tie_embeddings, tie_output, joint
):
    src_tok, trg_tok = tokenizers[joint]
    cfg = TransformerConfig(
        d_model=32,
        ff_size=64,
        encoder_layers=2,
        decoder_layers=2,
        heads=4,
        dropout=0.0,
        norm=norm,
        positions=positions,
        max_positions=64,
        tie_embeddings=tie_embeddings,
        tie_output=tie_output,
    )
    model = short_training(cfg, src_tok, trg_tok)
    out = export.export_ctranslate2(model, cfg, src_tok, trg_tok, tmp_path / "ct2")
    src_vocab, trg_vocab = export.vocabulary(src_tok), export.vocabulary(trg_tok)
    assert (src_vocab == trg_vocab) == joint
    assert (out / ("shared_vocabulary.json" if joint else "source_vocabulary.json")).exists()
    spm_files = {"spm.model"} if joint else {"source.spm.model", "target.spm.model"}
    assert {p.name for p in out.glob("*.model")} == spm_files
    if not joint:
        assert (out / "target.spm.model").read_bytes() == trg_tok.model_path.read_bytes()
    translator = ct2.Translator(str(out), intra_threads=1)

    ids, batch = source_batch(src_tok, SOURCES)
    pieces = [[src_vocab[i] for i in s] for s in ids]
    ours = [
        h.tokens
        for h in greedy_search(
            model, batch.src, batch.src_mask, torch.full((batch.src.shape[0],), MAX_LEN), BOS_ID, EOS_ID
        )
    ]
    options = export.ctranslate2_options(DecodeConfig(beam_size=1))
    results = translator.translate_batch(pieces, max_decoding_length=MAX_LEN, **options)
    theirs = [ct2_ids(trg_vocab, r.hypotheses[0]) for r in results]
    assert theirs == ours
    assert len({tuple(h) for h in ours}) > 3  # the outputs differ by sentence: the check has teeth

    # Teacher-forced log-probabilities of every target token, EOS included, on arbitrary targets.
    g = torch.Generator().manual_seed(1)
    targets = [torch.randint(4, trg_tok.vocab_size, (3 + i % 5,), generator=g).tolist() for i in range(len(ids))]
    tf = make_batch(ids, targets, range(len(ids)), PAD_ID, BOS_ID, EOS_ID)
    with torch.no_grad():
        logp = torch.log_softmax(model(tf.src, tf.src_mask, tf.trg_in), -1).gather(2, tf.trg_out[..., None])[..., 0]
    scored = translator.score_batch(pieces, [[trg_vocab[i] for i in t] for t in targets])
    for row, (target, result) in enumerate(zip(targets, scored)):
        expected = logp[row, : len(target) + 1]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=2e-4, rtol=1e-4)


def test_beam_scores_count_eos_in_the_length(ct2, tokenizers, tmp_path):
    """CTranslate2's beam score, with our options, is ours: sum of log-probabilities / |y|**alpha, EOS in |y|."""
    src_tok, trg_tok = tokenizers[True]
    cfg = TransformerConfig(
        d_model=32, ff_size=64, encoder_layers=1, decoder_layers=1, heads=4, dropout=0.0, norm="pre"
    )
    model = short_training(cfg, src_tok, trg_tok, steps=20)
    translator = ct2.Translator(
        str(export.export_ctranslate2(model, cfg, src_tok, trg_tok, tmp_path / "m")), intra_threads=1
    )
    vocab = export.vocabulary(src_tok)
    ids, batch = source_batch(src_tok, SOURCES)
    decode = DecodeConfig(beam_size=4, length_penalty=0.7, nbest=4)
    results = translator.translate_batch(
        [[vocab[i] for i in s] for s in ids],
        max_decoding_length=MAX_LEN,
        return_scores=True,
        **export.ctranslate2_options(decode),
    )
    ours = beam_search(
        model, batch.src, batch.src_mask, torch.full((batch.src.shape[0],), MAX_LEN), 4, 0.7, BOS_ID, EOS_ID, nbest=4
    )
    agree = 0
    for row, result in enumerate(results):
        hyps = [ct2_ids(vocab, h) for h in result.hypotheses]
        tf = make_batch([ids[row]] * len(hyps), hyps, range(len(hyps)), PAD_ID, BOS_ID, EOS_ID)
        with torch.no_grad():
            logp = torch.log_softmax(model(tf.src, tf.src_mask, tf.trg_in), -1).gather(2, tf.trg_out[..., None])[..., 0]
        for i, (h, score) in enumerate(zip(result.hypotheses, result.scores)):
            ends = h[-1] == vocab[EOS_ID]  # a hypothesis cut at max length has no EOS
            n = len(hyps[i]) + ends
            assert score == pytest.approx(float(logp[i, :n].sum()) / n**0.7, abs=1e-4)
        agree += hyps[0] == ours[row][0].tokens
    assert agree >= len(SOURCES) - 2  # the searches stop differently (see the README), rarely matters


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_long_sources_and_outputs_are_cut_as_nmt_translate_cuts_them(ct2, tokenizers, tmp_path, positions):
    """A source longer than the positions and an output limit past them (max_len_a 10): the exported
    model reads the same first max_positions - 1 pieces and stops at max_positions tokens, as ours."""
    from nmt.device import Precision
    from nmt.translate import Translator

    src_tok, trg_tok = tokenizers[True]
    P = 32  # the training pairs need 21
    cfg = TransformerConfig(
        d_model=32,
        ff_size=64,
        encoder_layers=1,
        decoder_layers=1,
        heads=4,
        dropout=0.0,
        positions=positions,
        max_positions=P,
    )
    model = short_training(cfg, src_tok, trg_tok, steps=30)
    out = export.export_ctranslate2(model, cfg, src_tok, trg_tok, tmp_path / "ct2")
    warnings: list[str] = []
    ours = Translator(model, src_tok, trg_tok, torch.device("cpu"), Precision("cpu", "fp32"), warn=warnings.append)
    lines = SOURCES + [" ".join(s for s, _ in PAIRS)]  # the last: 119 pieces
    assert len(src_tok.encode(lines[-1:])[0]) > P
    translator = ct2.Translator(str(out), intra_threads=1)

    greedy = DecodeConfig(beam_size=1, max_len_a=10, max_len_b=10)
    scored = ours.translate_scored(lines, greedy)
    assert warnings and "line 12 is" in warnings[0]  # the long source was cut
    assert max(h.steps for ((_, h),) in scored) == P  # and some output ran into the positions
    got = export.translate_lines(translator, src_tok, trg_tok, lines, greedy, max_positions=P)
    assert got == [text for ((text, _),) in scored]

    # Beam search stops differently (see the README), but decodes within the same limits.
    beam = DecodeConfig(beam_size=3, max_len_a=10, max_len_b=10)
    got = export.translate_lines(translator, src_tok, trg_tok, lines, beam, max_positions=P)
    assert len(got) == len(lines) and all(got)


def test_exported_readme_limits_to_the_positions(ct2, tokenizers, tmp_path):
    """The exported README's example runs as written and keeps within the model's positions."""
    src_tok, trg_tok = tokenizers[True]
    cfg = TransformerConfig(
        d_model=32, ff_size=64, encoder_layers=1, decoder_layers=1, heads=4, dropout=0.0, max_positions=24
    )
    model = short_training(cfg, src_tok, trg_tok, steps=5)
    decode = DecodeConfig(beam_size=2, max_len_a=10, max_len_b=10)
    out = export.export_ctranslate2(model, cfg, src_tok, trg_tok, tmp_path / "ct2", decode=decode)
    readme = (out / "README.md").read_text()
    assert "24 positions" in readme
    code = readme.split("```python\n")[1].split("```")[0]
    long_line = " ".join(s for s, _ in PAIRS)
    code = code.replace('"Ein Hund läuft."', repr(long_line)).replace('compute_type="default"', "intra_threads=1")
    printed = []
    names = {"print": printed.append}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out)
        exec(compile(code, "README.md", "exec"), names)
    assert len(names["pieces"][0]) == 23 and names["limit"] == 24  # 10 * 23 + 10 capped
    assert len(printed) == 1 and printed[0][0]


@pytest.fixture
def fake_run(tokenizers, tmp_path):
    """A run directory as 'nmt train' leaves it: config, SentencePiece model, best checkpoint."""

    def make(model_type="transformer", **model):
        config = yaml.safe_load(tiny_config(tmp_path, model_type).read_text())
        config["model"].update(model)
        config["train"].update(threads=1, fp32_matmul="blas")  # nothing for autotune to measure
        if model_type == "transformer":  # the LSTM has no attention kernel, and naming one is an error
            config["train"]["attention"] = "explicit"
        run = tmp_path / "run"
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        src_tok, trg_tok = tokenizers[True]
        (run / "spm.model").write_bytes(src_tok.model_path.read_bytes())
        if model_type == "transformer":
            model = short_training(TransformerConfig(**config["model"]), *tokenizers[True])
            checkpoint_file.save({"model": model.state_dict()}, run / "checkpoints" / "best_00000001.pt")
            index = {"best": [{"file": "best_00000001.pt", "score": 1.0, "update": 1}]}
            (run / "checkpoints" / "index.json").write_text(json.dumps(index))  # a best is recorded with its score
        return run

    return make


def test_cli_export_translates_as_nmt_translate(ct2, fake_run, tmp_path, capsys):
    from nmt.translate import load_translator

    run = fake_run(norm="post", positions="learned")
    assert main(["export", "--format", "ctranslate2", str(run), str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    info = json.loads((out / "nmt_export.json").read_text())
    assert info["sentencepiece"] == {"source": "spm.model", "target": "spm.model"}
    assert (out / "spm.model").read_bytes() == (run / "spm.model").read_bytes()
    assert {"model.bin", "config.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert not list(tmp_path.glob(".out.tmp*"))

    ours = load_translator(RunDir.existing(run), "cpu", "fp32")
    decode = DecodeConfig(beam_size=1, max_len_a=0.5, max_len_b=1)  # limits that cut: each sentence's own must apply
    lines = SOURCES + ["", "\u200b"]  # blank, and blank once normalized: CTranslate2 writes nothing for either
    expected = [h[0] for h in ours.translate(lines, decode)]
    assert expected[-2:] == ["", ""]
    positions = info["model"]["max_positions"]
    got = export.translate_lines(
        ct2.Translator(str(out), intra_threads=1),
        ours.src_tok,
        ours.trg_tok,
        lines,
        decode,
        max_positions=positions,
    )
    assert got == expected
    ungrouped = export.translate_lines(
        ct2.Translator(str(out), intra_threads=1),
        ours.src_tok,
        ours.trg_tok,
        SOURCES,
        decode,
        False,
        max_positions=positions,
    )
    assert ungrouped != expected[:-2]  # one limit for all (the longest) cuts the short sentences later

    # int8 weights: a smaller file that still loads and translates
    assert main(["export", "--format", "ctranslate2", "--quantization", "int8", str(run), str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "model.bin").stat().st_size < 0.7 * (out / "model.bin").stat().st_size
    assert len(
        export.translate_lines(
            ct2.Translator(str(tmp_path / "q"), intra_threads=1),
            ours.src_tok,
            ours.trg_tok,
            SOURCES,
            decode,
            max_positions=positions,
        )
    ) == len(SOURCES)


def one_line_error(capsys, argv, *needles):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err
    return err


def test_existing_output_and_unknown_quantization_are_refused(ct2, fake_run, tmp_path, capsys):
    run = fake_run()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    one_line_error(capsys, ["export", "--format", "ctranslate2", run, tmp_path / "full"], "not an empty directory")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    one_line_error(capsys, ["export", "--format", "ctranslate2", "--quantization", "int3", run, tmp_path / "o"], "int8")
    assert not (tmp_path / "o").exists()
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    assert main(["export", "--format", "ctranslate2", str(run), str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "model.bin").exists()


def test_an_output_directory_under_a_file_is_a_one_line_error(ct2, fake_run, tmp_path, capsys):
    # the parent's mkdir was a FileExistsError traceback
    run = fake_run()
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / "notes.txt" / "model"
    one_line_error(capsys, ["export", "--format", "ctranslate2", run, out], f"{out}: cannot create its directory")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_existing_empty_output_directory_is_filled_not_replaced(ct2, fake_run, tmp_path, capsys, monkeypatch):
    """An empty OUT_DIR may be one that cannot be removed or renamed (a container's volume: EBUSY), a
    symlink, or the working directory: the files go into it, and it keeps its inode and mode."""
    run = fake_run()
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o1777)
    inode = empty.stat().st_ino
    assert main(["export", "--format", "ctranslate2", str(run), str(empty)]) == 0
    assert empty.stat().st_ino == inode and empty.stat().st_mode & 0o7777 == 0o1777
    assert {"model.bin", "config.json", "spm.model", "nmt_export.json", "README.md"} <= {
        p.name for p in empty.iterdir()
    }
    assert not [p for p in empty.iterdir() if p.name.startswith(".")]

    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert main(["export", "--format", "ctranslate2", str(run), str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target" / "model.bin").exists()

    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert main(["export", "--format", "ctranslate2", str(run), "."]) == 0
    assert (tmp_path / "here" / "model.bin").exists()


def test_a_failed_move_into_an_empty_output_directory_leaves_it_empty(ct2, fake_run, tmp_path, capsys, monkeypatch):
    run = fake_run()
    (tmp_path / "empty").mkdir()
    replace, calls = export.os.replace, []

    def fail_third(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(export.os, "replace", fail_third)
    one_line_error(capsys, ["export", "--format", "ctranslate2", run, tmp_path / "empty"], "No space left on device")
    assert list((tmp_path / "empty").iterdir()) == []


def test_an_output_directory_inside_the_run_is_refused(fake_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export, "import_ctranslate2", lambda: None)  # refused before the package is needed
    run = fake_run()
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    (tmp_path / "alias").symlink_to(run)
    for out in (run / "exported", run, tmp_path / "alias" / "exported"):
        one_line_error(capsys, ["export", "--format", "ctranslate2", run, out], f"OUT_DIR {out}: is inside the run")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_rnn_run_is_a_one_line_error(fake_run, tmp_path, capsys, monkeypatch):
    def missing():  # the package is not installed: its install would not help an RNN run, so that is said
        raise NMTError(f"exporting to CTranslate2 needs the ctranslate2 package: {export.INSTALL_HINT}")

    monkeypatch.setattr(export, "import_ctranslate2", missing)
    run = fake_run("rnn")
    one_line_error(capsys, ["export", "--format", "ctranslate2", run, tmp_path / "out"], "model type 'rnn'")
    with pytest.raises(NMTError, match="only Transformer"):
        export.check_exportable(RNNConfig())
    assert not (tmp_path / "out").exists()


def test_missing_package_is_a_one_line_error(fake_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import then raises ImportError
    run = fake_run()
    one_line_error(capsys, ["export", "--format", "ctranslate2", run, tmp_path / "out"], "pip install 'nmt[export]'")
    assert not (tmp_path / "out").exists()


def test_max_decoding_lengths_follow_nmt_search():
    from nmt.search import max_output_lengths

    lengths = [0, 1, 5, 17, 40]
    mask = torch.zeros(len(lengths), 42, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, : n + 1] = True  # + EOS
    for a, b in [(1.2, 10), (0.0, 3), (1.5, 0)]:
        for max_positions in (None, 12):
            expected = max_output_lengths(mask, a, b, max_positions).tolist()
            got = export.max_decoding_lengths(lengths, DecodeConfig(max_len_a=a, max_len_b=b), max_positions)
            assert got == expected


def test_ct2_compare_runs_on_a_run_that_writes_nbest_lists(ct2, fake_run, tmp_path, monkeypatch, capsys):
    """scripts/ct2_compare.py compares the best translations: a run whose decode.nbest is above 1
    (more than greedy's beam of 1) still gets its greedy and beam-5 comparison."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import ct2_compare

    run = fake_run()
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"]["nbest"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    text = tmp_path / "test.txt"
    text.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    argv = ["ct2_compare.py", str(run), "--src", str(text), "--ref", str(text), "--repeats", "1", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    assert ct2_compare.main() == 0
    assert f"greedy fp32, CTranslate2 grouped: {len(SOURCES)}/{len(SOURCES)} lines identical" in capsys.readouterr().err


def test_ct2_compare_decodes_with_the_machines_cores_by_default(ct2, fake_run, tmp_path, monkeypatch):
    """The default was 2 threads, the core count of the machine it was written on, on any machine."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import ct2_compare

    monkeypatch.setattr(ct2_compare, "usable_cpus", lambda: 3, raising=False)
    text = tmp_path / "test.txt"
    text.write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    out = tmp_path / "compare.json"
    argv = ["ct2_compare.py", str(fake_run()), "--src", str(text), "--ref", str(text), "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--json", str(out)])
    assert ct2_compare.main() == 0
    assert json.loads(out.read_text())["threads"] == 3
