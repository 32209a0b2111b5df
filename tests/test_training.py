"""The update itself: accumulation equals one large batch; non-finite updates are skipped."""

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from nmt import testhooks
from nmt.batching import make_batch, token_batches
from nmt.cli import main
from nmt.config import load_config
from nmt.errors import NMTError
from nmt.loss import teacher_forced_loss
from nmt.rundir import RunDir
from nmt.schedule import learning_rate
from nmt.trainer import Trainer
from nmt.validation import evaluate_loss


def make_trainer(tmp_path: Path, **train) -> Trainer:
    cfg = load_config(tiny_config(tmp_path, **train))
    trainer = Trainer(cfg, RunDir(cfg.run_dir), lambda message: None)
    trainer.setup()
    return trainer


def test_accumulated_update_equals_one_large_batch(tmp_path):
    trainer = make_trainer(tmp_path, clip_norm=0.0)
    start_model = copy.deepcopy(trainer.model.state_dict())
    start_optim = copy.deepcopy(trainer.optimizer.state_dict())
    rows_a, rows_b = [0, 1, 2], [3, 4, 5, 6, 7]

    trainer.train_step([rows_a, rows_b])
    accumulated = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}

    trainer.model.load_state_dict(start_model)
    trainer.optimizer.load_state_dict(start_optim)
    trainer.progress.update = 0
    trainer.train_step([rows_a + rows_b])
    # Gradients, not parameters: Adam's first step, lr * g / |g|, would amplify rounding noise.
    for name, param in trainer.model.named_parameters():
        assert torch.allclose(param.grad, accumulated[name], atol=1e-6, rtol=1e-4), name
    assert accumulated["trg_embed.weight"].abs().sum() > 0


def test_an_update_s_loss_is_the_label_smoothed_cross_entropy_per_real_target_token(tmp_path):
    """The update trains on train.label_smoothing, and its statistics are per real target token (EOS
    counted, padding not): against PyTorch's label-smoothed cross-entropy of the model's own logits."""
    trainer = make_trainer(tmp_path, label_smoothing=0.1)
    tok, rows = trainer.data.trg_tok, list(range(8))
    batch = make_batch(*trainer.data.train.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id)
    assert bool((batch.trg_out == tok.pad_id).any())  # sentences of several lengths: padding to leave out
    with torch.no_grad():
        logits = trainer.model(batch.src, batch.src_mask, batch.trg_in).flatten(0, 1)
    target, tokens = batch.trg_out.flatten(), int((batch.trg_out != tok.pad_id).sum())
    smoothed = F.cross_entropy(logits, target, ignore_index=tok.pad_id, label_smoothing=0.1, reduction="sum")
    plain = F.cross_entropy(logits, target, ignore_index=tok.pad_id, reduction="sum")
    stats = trainer.train_step([rows])
    assert stats["trg_tokens"] == tokens
    assert stats["loss"] == pytest.approx(smoothed.item() / tokens, rel=1e-5)
    assert stats["nll"] == pytest.approx(plain.item() / tokens, rel=1e-5)
    trainer.close()


def test_gradients_are_clipped_to_clip_norm_and_the_norm_before_clipping_is_reported(tmp_path):
    """train.clip_norm scales the update's whole gradient down to that L2 norm where it is larger and
    leaves a smaller one as it is; the statistics report the L2 norm before clipping."""
    trainer = make_trainer(tmp_path, clip_norm=0.0)
    start_model = copy.deepcopy(trainer.model.state_dict())
    start_optim = copy.deepcopy(trainer.optimizer.state_dict())
    found = {}
    for clip in (0.0, 1e6, 0.05):  # off, far above the norm, far below it
        trainer.model.load_state_dict(start_model)
        trainer.optimizer.load_state_dict(start_optim)
        trainer.progress.update = 0
        trainer.cfg.train.clip_norm = clip
        stats = trainer.train_step([list(range(8))])
        found[clip] = stats["grad_norm"], [p.grad.clone() for p in trainer.model.parameters()]
    norm, raw = found[0.0]
    assert norm == pytest.approx(torch.linalg.vector_norm(torch.cat([g.flatten() for g in raw])).item(), rel=1e-5)
    assert norm > 0.5  # well above the 0.05 clipped to
    for clip, (reported, grads) in found.items():
        assert reported == pytest.approx(norm, rel=1e-5)
        scale = clip / norm if 0 < clip < norm else 1.0
        for got, unclipped in zip(grads, raw):
            torch.testing.assert_close(got, unclipped * scale, rtol=1e-4, atol=1e-9)
    trainer.close()


def test_updates_are_adamw_steps_with_the_configs_betas_eps_and_weight_decay(tmp_path):
    """Two updates against AdamW worked out by hand (bias-corrected moments, weight decay decoupled and
    on every parameter), with train.betas, adam_eps and weight_decay away from torch's defaults. Two,
    since the first alone cannot tell the betas: its bias correction cancels them."""
    b1, b2, eps, decay = 0.8, 0.9, 1e-3, 0.1
    trainer = make_trainer(tmp_path, betas=[b1, b2], adam_eps=eps, weight_decay=decay, clip_norm=0.0)
    params = list(trainer.model.parameters())
    theta = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step in (1, 2):
        lr = trainer.train_step([list(range(8))])["lr"]
        for i, p in enumerate(params):
            g = p.grad
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            direction = (m[i] / (1 - b1**step)) / ((v[i] / (1 - b2**step)).sqrt() + eps)
            theta[i] = theta[i] * (1 - lr * decay) - lr * direction
            torch.testing.assert_close(p.detach(), theta[i], rtol=1e-5, atol=1e-7)
    trainer.close()


@pytest.mark.parametrize("max_tokens", [512, 48])  # the dev set in one batch; in four, three of them padded
def test_dev_loss_is_the_mean_nll_per_real_target_token(tmp_path, max_tokens):
    """evaluate_loss batches the dev set, with padding: it equals each sentence scored alone, summed and
    divided by the real target tokens (EOS counted), as dev_loss and dev_ppl report it."""
    trainer = make_trainer(tmp_path)
    tok, dev = trainer.data.trg_tok, trainer.data.dev
    assert len(set(dev.trg_lens.tolist())) > 1  # one batch of several lengths: padded
    batches = len(token_batches(dev.src_lens, dev.trg_lens, max_tokens, None, 0))
    assert batches == (1 if max_tokens == 512 else 4)  # with 4, a sum that kept one batch's would be far off
    got = evaluate_loss(trainer.model, dev, tok, max_tokens, trainer.precision, trainer.device)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(dev)):
            batch = make_batch(*dev.pairs([i]), [i], tok.pad_id, tok.bos_id, tok.eos_id)
            logits = trainer.model(batch.src, batch.src_mask, batch.trg_in)[0]
            total += F.cross_entropy(logits, batch.trg_out[0], reduction="sum").item()
            tokens += batch.trg_out.shape[1]
    assert got == pytest.approx(total / tokens, rel=1e-5)
    trainer.close()


def test_dev_loss_reads_the_device_once_and_equals_the_per_batch_sum(tmp_path, monkeypatch):
    """The NLL is summed where the model runs and read once per dev pass (on a GPU a read after every
    batch made the host wait for each), and the result is the same to the bit as the batches' NLLs
    read one by one and summed in Python."""
    trainer = make_trainer(tmp_path)
    tok, dev, model = trainer.data.trg_tok, trainer.data.dev, trainer.model
    plan = token_batches(dev.src_lens, dev.trg_lens, 48, None, 0)
    assert len(plan) > 1
    total, tokens = 0.0, 0
    with torch.inference_mode():
        for rows in plan:
            batch = make_batch(*dev.pairs(rows), rows, tok.pad_id, tok.bos_id, tok.eos_id)
            total += teacher_forced_loss(model, model, batch, 0.0, tok.pad_id, trainer.precision)[1].item()
            tokens += batch.n_trg_tokens
    reads = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda tensor: reads.append(tensor) or item(tensor))
    got = evaluate_loss(model, dev, tok, 48, trainer.precision, trainer.device)
    assert len(reads) == 1
    assert got == total / tokens
    trainer.close()


def test_non_finite_updates_are_skipped_then_stop(tmp_path):
    trainer = make_trainer(tmp_path, max_nonfinite=2)
    with torch.no_grad():
        trainer.model.trg_embed.weight[5] = float("nan")  # poisons every sentence that uses token 5
    poisoned = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rows = list(range(8))
    assert trainer.train_step([rows]) is None
    assert trainer.progress.update == 0 and trainer.progress.skipped_updates == 1
    for name, tensor in trainer.model.state_dict().items():  # nothing was stepped, NaN for NaN
        torch.testing.assert_close(tensor, poisoned[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert not trainer.optimizer.state  # no moment estimates were taken from the poisoned gradient
    with pytest.raises(NMTError, match="diverged: 2 non-finite updates in a row"):
        trainer.train_step([rows])


def fp16_trainer(tmp_path: Path, monkeypatch, **train) -> Trainer:
    """A trainer on the fp16 path (autocast and GradScaler), which torch also has on a CPU."""
    monkeypatch.setenv(testhooks.FP16_ON_CPU, "1")
    kernels = {"attention": "sdpa", "threads": 1, "fp32_matmul": "blas"}  # nothing to measure
    return make_trainer(tmp_path, precision="fp16", **kernels, **train)


def test_fp16_a_non_finite_loss_is_skipped_and_the_next_update_runs(tmp_path, monkeypatch):
    trainer = fp16_trainer(tmp_path, monkeypatch)
    assert trainer.scaler.is_enabled()
    rows = list(range(8))
    healthy = trainer.model.trg_embed.weight[5].detach().clone()
    with torch.no_grad():
        trainer.model.trg_embed.weight[5] = float("nan")
    assert trainer.train_step([rows]) is None
    with torch.no_grad():
        trainer.model.trg_embed.weight[5] = healthy
    assert trainer.train_step([rows]) is not None  # once raised: unscale_() already called since update()
    assert trainer.progress.update == 1


def test_fp16_a_skipped_non_finite_loss_leaves_the_loss_scale_and_its_growth_count(tmp_path, monkeypatch):
    """A loss of inf over finite gradients (a target the model gives probability 0) is no overflow:
    the scale stays, as fairseq's would, and the update that was skipped is not one of the good ones
    GradScaler counts to double its scale (growth_interval): only updates made count."""
    import nmt.update_step

    trainer = fp16_trainer(tmp_path, monkeypatch)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    real, poisoned = nmt.update_step.teacher_forced_loss, [False]

    def loss_of_inf(model, *args, **kwargs):
        loss, nll = real(model, *args, **kwargs)
        return (loss + float("inf"), nll) if poisoned[0] else (loss, nll)  # the gradient stays finite

    monkeypatch.setattr(nmt.update_step, "teacher_forced_loss", loss_of_inf)
    rows = list(range(8))
    assert trainer.train_step([rows]) is not None  # one good update of the 2 that double the scale
    poisoned[0] = True
    assert trainer.train_step([rows]) is None
    assert trainer.progress.nonfinite_in_row == 1 and trainer.progress.update == 1
    assert trainer.scaler.get_scale() == 1024.0  # not doubled: the skipped update is not a good one
    poisoned[0] = False
    assert trainer.train_step([rows]) is not None
    assert trainer.scaler.get_scale() == 2048.0  # the second update made
    trainer.close()


def test_fp16_overflows_are_not_updates_and_stop_the_run_below_the_minimum_loss_scale(tmp_path, monkeypatch):
    trainer = fp16_trainer(tmp_path, monkeypatch, max_nonfinite=1)
    trainer.model.trg_embed.weight.register_hook(lambda grad: grad * float("inf"))  # overflows at any scale
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rows = list(range(8))
    for _ in range(29):  # 65536 halved 29 times is 1.2e-4, still above the minimum
        assert trainer.train_step([rows]) is None
    p = trainer.progress
    assert (p.update, p.skipped_updates, p.trg_tokens, p.nonfinite_in_row) == (0, 29, 0, 0)
    assert trainer.scaler.get_scale() == 65536.0 * 0.5**29
    assert trainer.optimizer.param_groups[0]["lr"] == learning_rate(1, trainer.cfg.train, 0.0)  # schedule stays
    assert not trainer.optimizer.state
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, start[name]), name
    with pytest.raises(NMTError, match=r"training diverged: the fp16 loss scale fell to 6.1e-05, below 0.0001"):
        trainer.train_step([rows])


def test_skipped_updates_leave_adamw_one_step_per_update_as_a_resume_checks(tmp_path, monkeypatch):
    # resume_problem refuses a state whose AdamW steps are not its update count: skipped updates (an
    # fp16 overflow, a non-finite loss) and accumulated batches must not make a sound state look stitched
    from nmt import checkpoint
    from nmt.training_state import resume_problem, training_state

    trainer = fp16_trainer(tmp_path, monkeypatch)
    overflow = [False]
    trainer.model.trg_embed.weight.register_hook(lambda grad: grad * float("inf") if overflow[0] else grad)
    rows = list(range(8))
    for skipped in (True, False, False, True, False):
        overflow[0] = skipped
        assert (trainer.train_step([rows[:4], rows[4:]]) is None) == skipped
    p = trainer.progress
    assert (p.update, p.skipped_updates) == (3, 2)
    state = training_state(trainer.model, trainer.optimizer, trainer.scaler, p, False, {})
    state["fingerprint"] = trainer.run.fingerprint(trainer.cfg)
    info = checkpoint.CheckpointInfo(tmp_path / "update_00000003.pt", "update", 3)
    assert resume_problem(info, state, trainer.optimizer) is None
    trainer.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_finite_gradients_whose_fp32_norm_overflows_are_clipped_not_skipped(tmp_path, monkeypatch, precision):
    """Gradients of 1e20 and more are finite, but their squares overflow fp32: clip_grad_norm_'s norm was
    inf, so fp32 counted the update non-finite and fp16 an overflow its scaler had not seen (the scale
    stayed, and every update was skipped). The norm is exact now, and clipping brings them to clip_norm."""
    trainer = fp16_trainer(tmp_path, monkeypatch) if precision == "fp16" else make_trainer(tmp_path)
    trainer.model.trg_embed.weight.register_hook(lambda grad: grad * 1e22)
    rows = list(range(8))
    for update in (1, 2):
        stats = trainer.train_step([rows])
        assert stats is not None and trainer.progress.update == update
        grads = [p.grad.double() for p in trainer.model.parameters()]
        assert all(bool(torch.isfinite(g).all()) for g in grads)
        assert 1e19 < stats["grad_norm"] < math.inf
        clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
        assert clipped == pytest.approx(trainer.cfg.train.clip_norm, rel=1e-4)
    assert trainer.progress.skipped_updates == 0
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    if precision == "fp16":
        assert trainer.scaler.get_scale() == 65536.0
    trainer.close()


def test_fp16_gradients_that_overflow_only_once_unscaled_still_halve_the_scale_until_the_run_stops(
    tmp_path, monkeypatch
):
    """Below a scale of 1, unscaling multiplies: scaled gradients of 3e38 are finite, so the scaler saw no
    overflow and kept its scale, while the unscaled ones are inf and the update was skipped, forever.
    Every skipped fp16 overflow halves the scale, and the run stops below the minimum as it should."""
    trainer = fp16_trainer(tmp_path, monkeypatch)
    trainer.scaler.load_state_dict({**trainer.scaler.state_dict(), "scale": 0.5})
    trainer.model.trg_embed.weight.register_hook(lambda grad: torch.full_like(grad, 3e38))
    rows = list(range(8))
    for halvings in range(1, 13):  # 0.5 halved 12 times is 1.2e-4, still above the minimum
        assert trainer.train_step([rows]) is None
        assert trainer.scaler.get_scale() == 0.5 ** (halvings + 1)
    assert trainer.progress.update == 0 and trainer.progress.skipped_updates == 12
    with pytest.raises(NMTError, match=r"training diverged: the fp16 loss scale fell to 6.1e-05, below 0.0001"):
        trainer.train_step([rows])
    trainer.close()


def test_fp16_overflows_while_the_scale_calibrates_do_not_stop_the_run(tmp_path, monkeypatch):
    trainer = fp16_trainer(tmp_path, monkeypatch, max_nonfinite=1)
    calls = [0]

    def overflow_three_times(grad):
        calls[0] += 1
        return grad * float("inf") if calls[0] <= 3 else grad

    trainer.model.trg_embed.weight.register_hook(overflow_three_times)
    results = [trainer.train_step([list(range(8))]) for _ in range(5)]
    assert [r is None for r in results] == [True, True, True, False, False]
    p = trainer.progress
    assert (p.update, p.skipped_updates, p.nonfinite_in_row) == (2, 3, 0)
    assert trainer.scaler.get_scale() == 65536.0 / 8
    assert results[-1]["lr"] == learning_rate(2, trainer.cfg.train, 0.0)
    assert all(math.isfinite(v) for v in results[-1].values())


def test_fp16_divergence_ends_nmt_train_with_exit_2_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
    """From the 4th training forward pass on the loss is inf (as an fp16 overflow in the forward makes
    it): the loss scale backs off 30 times, then the run stops with one line; update 2's checkpoint stays."""
    import nmt.update_step

    monkeypatch.setenv(testhooks.FP16_ON_CPU, "1")
    real, calls = nmt.update_step.teacher_forced_loss, [0]

    def overflowing_loss(model, *args, **kwargs):
        loss, nll = real(model, *args, **kwargs)
        calls[0] += model.training
        return (loss * float("inf"), nll) if model.training and calls[0] >= 4 else (loss, nll)

    monkeypatch.setattr(nmt.update_step, "teacher_forced_loss", overflowing_loss)
    settings = ["precision=fp16", "attention=sdpa", "threads=1", "fp32_matmul=blas", "validate_every=2"]
    config = tiny_config(tmp_path, max_updates=20, warmup_updates=1)
    assert main(["train", "--config", str(config), *[a for s in settings for a in ("--set", "train." + s)]]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "training diverged: the fp16 loss scale fell" in errors[0]
    run = tmp_path / "run"
    assert "update 4: fp16 gradients overflowed, skipped; loss scale now 32768" in (run / "train.log").read_text()
    saved = [torch.load(path, weights_only=False) for path in (run / "checkpoints").glob("*.pt")]
    assert [state["progress"]["update"] for state in saved if "optimizer" in state] == [2]


def test_public_api_trains_validates_and_saves(tmp_path):
    """What bench and the loop use: epoch_plan, train_step, validate, save; and a resume from it."""
    trainer = make_trainer(tmp_path, max_updates=4, warmup_updates=1)
    batch = trainer.epoch_plan()[0]
    stats = [trainer.train_step([batch]) for _ in range(3)]
    assert [s["trg_tokens"] for s in stats] == [int(trainer.data.train.trg_lens[batch].sum()) + len(batch)] * 3
    assert stats[2]["loss"] < stats[0]["loss"]
    record = trainer.validate()
    assert record["update"] == 3 and 0 <= record["dev_bleu"] <= 100
    trainer.save()
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.close()
    again = make_trainer(tmp_path, max_updates=4, warmup_updates=1)
    assert again.progress.update == 3
    for name, tensor in again.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    again.close()


def test_records_number_an_epoch_s_last_update_with_that_epoch(tmp_path):
    # The position moves to the next epoch as its last batch is consumed; the records and log lines
    # are about the update, whose batches came from the epoch before.
    import json

    from nmt.cli import main

    config = tiny_config(
        tmp_path, max_updates=None, max_epochs=2, max_tokens=96, warmup_updates=2, validate_every=1000, threads=1
    )
    assert main(["train", "--config", str(config)]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    epochs = [r["epoch"] for r in train]
    assert epochs == sorted(epochs) and set(epochs) == {1, 2} and len(epochs) > 2
    assert epochs.count(1) == epochs.count(2)  # the same data, the same number of batches
    [final] = [r for r in records if r["type"] == "valid"]
    assert final["epoch"] == 2 and final["update"] == train[-1]["update"]


def test_the_loop_gives_freed_memory_back_at_start_every_release_interval_and_after_validation(tmp_path, monkeypatch):
    # glibc keeps the holes that batches of other shapes leave in the heap (nmt.device); the loop
    # returns them regularly, and after validation, whose decoding frees blocks of its own sizes.
    from nmt import training

    released = []
    monkeypatch.setattr(training, "RELEASE_EVERY", 50)
    monkeypatch.setattr(Trainer, "release_freed_memory", lambda self: released.append(self.progress.update))
    config = tiny_config(tmp_path, max_updates=120, validate_every=60, threads=1)
    training.train(load_config(config), lambda message: None)
    assert released == [0, 50, 60, 100, 120]


def test_patience_and_the_best_checkpoint_count_a_lower_dev_loss_at_equal_bleu(tmp_path, monkeypatch):
    # Early in training BLEU ties at 0 while the dev loss falls: that is progress, not a bad validation.
    import nmt.validation
    from nmt import checkpoint
    from nmt.training import stop_reason

    losses = iter([5.2, 4.8, 4.5, 4.5, 4.7])
    monkeypatch.setattr(nmt.validation, "evaluate_loss", lambda *args: next(losses))
    monkeypatch.setattr(nmt.validation, "dev_bleu", lambda translator, cfg, src, trg, *step: (0.0, ["" for _ in src]))
    trainer = make_trainer(tmp_path, patience=2, warmup_updates=1)
    p, t = trainer.progress, trainer.cfg.train
    verdicts = []
    for _ in range(5):
        trainer.train_step([trainer.epoch_plan()[0]])
        trainer.validate()
        verdicts.append((p.bad_validations, stop_reason(t, p)))
    assert [bad for bad, _ in verdicts] == [0, 0, 0, 1, 2]
    assert [reason is None for _, reason in verdicts] == [True] * 4 + [False]
    assert (p.best_update, p.best_loss) == (3, 4.5)
    manager = trainer.checkpoints
    assert manager.best_path().name == "best_00000003.pt"
    assert manager.read_index()["best"] == [{"file": "best_00000003.pt", "score": 0.0, "update": 3, "loss": 4.5}]
    trainer.close()
    assert checkpoint.best_rank(1.0, 9.0) > checkpoint.best_rank(0.0, 1.0)  # BLEU first


@pytest.mark.parametrize("keep_best", [1, 2])
def test_keep_best_keeps_the_best_validations_not_only_the_new_bests(tmp_path, monkeypatch, keep_best):
    # Dev BLEU 10, 20, 15: the two best are 20 and 15, though 15 was no new best when it came.
    import nmt.validation

    bleus = iter([10.0, 20.0, 15.0])
    monkeypatch.setattr(nmt.validation, "evaluate_loss", lambda *args: 3.0)
    monkeypatch.setattr(nmt.validation, "dev_bleu", lambda translator, cfg, src, trg, *step: (next(bleus), []))
    trainer = make_trainer(tmp_path, keep_best=keep_best, warmup_updates=1)
    for _ in range(3):
        trainer.train_step([trainer.epoch_plan()[0]])
        trainer.validate()
    manager = trainer.checkpoints
    kept = [(b["file"], b["score"]) for b in manager.read_index()["best"]]
    assert kept == [("best_00000002.pt", 20.0), ("best_00000003.pt", 15.0)][:keep_best]
    assert sorted(p.name for p in manager.directory.glob("best_*.pt")) == sorted(name for name, _ in kept)
    assert manager.best_path().name == "best_00000002.pt"
    assert (trainer.progress.best_update, trainer.progress.bad_validations) == (2, 1)
    trainer.close()


def test_a_progress_of_an_earlier_version_has_no_best_loss_yet():
    import math

    from nmt.training_state import Progress

    old = Progress.from_dict({"update": 40, "best_bleu": 12.5, "best_update": 30, "bad_validations": 1})
    assert old.best_loss == math.inf and old.best_bleu == 12.5


def test_cpu_training_on_a_machine_with_a_gpu_never_initialises_cuda(tmp_path, monkeypatch, capsys):
    """The random state saved (and taken before every update) holds the GPUs' only where the run computes
    on one: reading it initialises CUDA, which took GPU memory for a CPU run and, where another job holds
    the GPU (exclusive-process mode), stopped it at its first update with a traceback."""

    def busy_gpu():
        raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", busy_gpu)
    config = tiny_config(tmp_path, device="cpu", max_updates=4, validate_every=4, warmup_updates=2)
    assert main(["train", "--config", str(config)]) == 0
    state = torch.load(tmp_path / "run" / "checkpoints" / "update_00000004.pt", weights_only=True)
    assert "cuda" not in state["rng"]


def test_train_log_keeps_the_update_lines_a_terminal_shows_as_a_progress_bar(tmp_path, monkeypatch):
    # On a terminal the loss, lr and throughput go to tqdm's bar; train.log is what is left of the
    # run once the terminal is closed, and holds them as a run under nohup writes them.
    import io
    import sys

    from nmt import training

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    config = tiny_config(tmp_path, max_updates=40, validate_every=40, log_every=20, threads=1)
    training.train(load_config(config), lambda message: None)
    log = (tmp_path / "run" / "train.log").read_text()
    words = [line.split()[2:] for line in log.splitlines()]  # after the date and time
    updates = [w for w in words if w[0] == "update"]
    assert [w[1] for w in updates] == ["20", "40"] and all(w[4] == "loss" and w[8] == "|g|" for w in updates)
    assert "loss" in sys.stderr.getvalue()  # the bar's
