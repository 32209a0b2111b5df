"""The training state: the checks that a saved one can be restored pass the states AdamW itself leaves,
and the random generators' state is put back as saved."""

import torch

from nmt.training_state import optimizer_state_problem, parameter_state_problem, rng_state, set_rng_state


def _stepped_adamw(steps: int) -> torch.optim.AdamW:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    optimizer = torch.optim.AdamW(params)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn_like(param)
        optimizer.step()
    return optimizer


def test_the_state_of_an_adamw_that_has_stepped_or_not_can_be_restored():
    for steps in (0, 3):
        assert optimizer_state_problem(_stepped_adamw(steps).state_dict(), _stepped_adamw(0)) is None


def test_a_parameter_not_stepped_yet_and_a_step_count_of_torch_before_1_12_are_restorable():
    moments = {"exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}
    assert parameter_state_problem("s", {}, torch.Size([4])) is None
    assert parameter_state_problem("s", {"step": 6.0, **moments}, torch.Size([4])) is None
    assert parameter_state_problem("s", {"step": 6, **moments}, torch.Size([4])) is None
    assert parameter_state_problem("s", {"step": torch.tensor(1.0), **moments}, torch.Size([4])) is None
    empty = {"exp_avg": torch.zeros(0), "exp_avg_sq": torch.zeros(0)}
    assert parameter_state_problem("s", {"step": torch.tensor(1.0), **empty}, torch.Size([0])) is None


def test_rng_state_roundtrip():
    import random

    state = rng_state()
    a = (random.random(), torch.rand(3))
    set_rng_state(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])


def test_rng_state_holds_the_gpus_state_only_for_a_run_on_a_gpu(monkeypatch):
    gpus = [torch.full((16,), 7, dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: gpus)
    assert rng_state(on_cuda=True)["cuda"] is gpus
    assert "cuda" not in rng_state(on_cuda=False)  # a CPU run never initialises CUDA for it


def test_rng_state_saved_where_more_gpus_were_visible_restores_those_present(monkeypatch):
    """An 8-GPU torchrun job's checkpoint holds 8 CUDA generator states; resumed with fewer GPUs, torch's
    set_rng_state_all would index generators that do not exist (IndexError), so only those present are set."""
    import random

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", lambda state, device: restored.append((state, device)))
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}  # as saved, less rng_state()'s CUDA call
    state["cuda"] = [torch.full((16,), 1, dtype=torch.uint8), torch.full((16,), 2, dtype=torch.uint8)]
    set_rng_state(state, on_cuda=True)
    assert [(int(s[0]), device) for s, device in restored] == [(1, 0)]
    set_rng_state(state, on_cuda=False)  # a CPU run resumed from a GPU run's checkpoint
    assert len(restored) == 1  # never initialises CUDA for it
