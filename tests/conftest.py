"""Shared test data: a handful of parallel sentences and a tiny config that trains in seconds."""

import errno
import json
import os
from pathlib import Path

import pytest
import torch
import yaml


@pytest.fixture(scope="session", autouse=True)
def _private_autotune_cache(tmp_path_factory):
    """Measured ``auto`` choices go to a cache of the test session, never the user's; subprocesses inherit it."""
    previous = os.environ.get("NMT_CACHE_DIR")
    os.environ["NMT_CACHE_DIR"] = str(tmp_path_factory.mktemp("nmt-cache"))
    yield
    if previous is None:
        os.environ.pop("NMT_CACHE_DIR", None)
    else:
        os.environ["NMT_CACHE_DIR"] = previous


PAIRS = [
    ("der hund sieht die katze", "the dog sees the cat"),
    ("die katze sieht den hund", "the cat sees the dog"),
    ("ein kleiner hund schläft", "a small dog sleeps"),
    ("die große katze läuft schnell", "the big cat runs fast"),
    ("zwei hunde spielen im garten", "two dogs play in the garden"),
    ("der mann liest ein buch", "the man reads a book"),
    ("eine frau trinkt kaffee", "a woman drinks coffee"),
    ("die kinder essen äpfel", "the children eat apples"),
]


def write_corpus(directory: Path, name: str, pairs) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.de").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (directory / f"{name}.en").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return directory / name


def _tiny_model(model_type: str) -> dict:
    common = {"type": model_type, "d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0}
    if model_type == "rnn":
        return {**common, "rnn_hidden": 64, "attention": "general"}
    return {**common, "ff_size": 128, "heads": 4, "norm": "pre"}


def tiny_config(tmp_path: Path, model_type: str = "transformer", **train) -> Path:
    prefix = write_corpus(tmp_path / "data", "train", PAIRS)
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "data": {"src_lang": "de", "trg_lang": "en", "train": str(prefix), "dev": str(prefix), "test": str(prefix)},
        "tokenizer": {"type": "bpe", "vocab_size": 60},
        "model": _tiny_model(model_type),
        "train": {
            "max_tokens": 512,
            "lr_peak": 0.01,
            "warmup_updates": 10,
            "label_smoothing": 0.0,
            "max_updates": 120,
            "validate_every": 60,
            "log_every": 20,
            "precision": "fp32",
            **train,
        },
        "decode": {"beam_size": 3, "max_len_a": 1.5, "max_len_b": 4},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def padded_training_batch(sentences: int, src_len: int, trg_len: int, vocab: int, pad_id: int = 0):
    """A teacher-forcing Batch of random ids (from torch's global generator) whose second source and
    last target end in padding from two thirds of their length on; ``trg_len`` counts BOS-side and
    shifted target together, as one row before the shift."""
    from nmt.batching import Batch

    src = torch.randint(1, vocab, (sentences, src_len))
    src_mask = torch.ones(sentences, src_len, dtype=torch.bool)
    src_mask[1, src_len * 2 // 3 :] = False
    trg = torch.randint(1, vocab, (sentences, trg_len))
    trg[-1, trg_len * 2 // 3 :] = pad_id
    return Batch(src.masked_fill(~src_mask, pad_id), src_mask, trg[:, :-1], trg[:, 1:], 0, 0, [])


NO_SPACE = os.strerror(errno.ENOSPC)


def refuse_writes(monkeypatch, *names: str) -> None:
    """A full disk for the files ``names``: ``nmt.files`` cannot create the temporary files they are written to."""
    from nmt import files

    real_open = open

    def opener(path, mode="r", *args, **kw):
        if "w" in mode and any(Path(path).name.startswith(f".{name}.tmp") for name in names):
            raise OSError(errno.ENOSPC, NO_SPACE, str(path))
        return real_open(path, mode, *args, **kw)

    monkeypatch.setattr(files, "open", opener, raising=False)


def cache_hub_dataset(cache: Path, name: str, commit: str, pairs, config: str = "default") -> Path:
    """Put commit ``commit`` of hub dataset ``name`` (``org/name``: rows with a ``translation``
    dict) into the ``datasets`` cache ``cache``, laid out as a download from the Hub leaves it:
    ``org___name/CONFIG/0.0.0/COMMIT``, which is what ``load_dataset`` reads offline."""
    from datasets.packaged_modules.json.json import Json

    org, short = name.split("/")
    rows = cache / f"rows-{commit}.jsonl"
    cache.mkdir(parents=True, exist_ok=True)
    rows.write_text("".join(json.dumps({"translation": {"de": s, "en": t}}) + "\n" for s, t in pairs))
    builder = Json(
        cache_dir=str(cache / "build"),
        dataset_name=short,
        config_name=config,
        hash=commit,
        data_files={"train": str(rows)},
    )
    builder.download_and_prepare()
    built = Path(builder.cache_dir)  # build/NAME/CONFIG-ID/0.0.0/COMMIT
    target = cache / f"{org}___{short}" / config / "0.0.0" / commit
    target.parent.mkdir(parents=True, exist_ok=True)
    built.rename(target)
    return target


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Running, not ended (a zombie not reaped yet has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
