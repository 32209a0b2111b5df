"""The checks that a saved training state can be restored pass the states AdamW itself leaves."""

import torch

from nmt.training_state import optimizer_state_problem, parameter_state_problem


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
