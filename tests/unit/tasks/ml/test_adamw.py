"""The training loop's AdamW and plateau schedule give torch.optim's weights and decisions bit for
bit, read and write torch's state dicts, and refuse a state of another optimiser or network
with a reason."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tasks.ml.adamw import AdamW, loop_optimizer
from tasks.ml.plateau import ReduceOnPlateau


def _network(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))


def _twins() -> tuple[nn.Module, nn.Module]:
    a, b = _network(), _network()
    b.load_state_dict(a.state_dict())
    return a, b


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(32, 6, generator=g), (torch.rand(32, 1, generator=g) > 0.5).float()


def _step(net: nn.Module, opt, i: int, lr: float | None = None) -> None:
    """One loop step, with the gradient cases the loop can meet: every 5th step one layer has
    no gradient (None) and every 7th one a gradient of zeros; ``lr`` set as the warm-up does."""
    x, y = _batch(i)
    opt.zero_grad(set_to_none=True)
    nn.functional.binary_cross_entropy_with_logits(net(x), y).backward()
    if i % 5 == 4:
        net[2].weight.grad = None
    if i % 7 == 6:
        net[0].bias.grad.zero_()
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.step()


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def _lr(i: int) -> float | None:
    """A warm-up over 10 steps, then a halving at step 25 (the plateau schedule's)."""
    return 3e-3 * (i + 1) / 10 if i < 10 else (1.5e-3 if i >= 25 else None)


@pytest.mark.parametrize("weight_decay", [1e-4, 0.0, 0.3])
def test_the_same_weights_and_moments_as_torch_adamw(weight_decay):
    ours_net, torch_net = _twins()
    ours = AdamW(ours_net.parameters(), lr=3e-3, weight_decay=weight_decay)
    theirs = torch.optim.AdamW(torch_net.parameters(), lr=3e-3, weight_decay=weight_decay)
    for i in range(40):
        _step(ours_net, ours, i, _lr(i))
        _step(torch_net, theirs, i, _lr(i))
    assert _same(ours_net, torch_net)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k, state in a["state"].items():
        assert state.keys() == b["state"][k].keys()
        assert all(torch.equal(v, b["state"][k][n]) for n, v in state.items())
        assert state["step"].dtype == b["state"][k]["step"].dtype == torch.float32
    assert a["state"][2]["step"].item() == 40 - 8  # layer 2's weight had no gradient 8 times


def test_the_weights_move_and_a_wrong_rule_would_show():
    """The parity test can fail: coupled weight decay (plain Adam's) gives other weights."""
    ours_net, torch_net = _twins()
    ours = AdamW(ours_net.parameters(), lr=3e-3, weight_decay=0.3)
    adam = torch.optim.Adam(torch_net.parameters(), lr=3e-3, weight_decay=0.3)
    before = {k: v.clone() for k, v in ours_net.state_dict().items()}
    for i in range(5):
        _step(ours_net, ours, i)
        _step(torch_net, adam, i)
    assert not _same(ours_net, torch_net)
    assert all(not torch.equal(before[k], v) for k, v in ours_net.state_dict().items())


@pytest.mark.parametrize("direction", ["torch to ours", "ours to torch"])
def test_a_state_dict_continues_in_the_other_implementation(direction):
    """A checkpoint written with torch.optim.AdamW (before this module) resumes with it, and
    the CUDA path's torch optimiser resumes a CPU checkpoint: the same weights as not switching."""
    first_net, straight_net = _twins()
    make = {
        "ours": lambda net: AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4),
        "torch": lambda net: torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4),
    }
    source, target = direction.split(" to ")
    first, straight = make[source](first_net), make[source](straight_net)
    for i in range(12):
        _step(first_net, first, i, _lr(i))
        _step(straight_net, straight, i, _lr(i))
    saved = first.state_dict()
    continued = make[target](first_net)
    continued.load_state_dict(saved)
    assert continued.param_groups[0]["lr"] == straight.param_groups[0]["lr"] != 2e-3
    for i in range(12, 30):
        _step(first_net, continued, i, _lr(i))
        _step(straight_net, straight, i, _lr(i))
    assert _same(first_net, straight_net)


def test_loading_copies_the_state_and_casts_it_to_the_parameters():
    net, twin = _twins()
    opt = AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    _step(net, opt, 0)
    saved = opt.state_dict()
    step_before = saved["state"][0]["step"].clone()
    double = twin.double()
    other = AdamW(double.parameters(), lr=5.0, weight_decay=0.0)
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == 1e-3  # the checkpoint's hyperparameters, as torch
    assert other.state[double[0].weight]["exp_avg"].dtype == torch.float64
    for p in double.parameters():
        p.grad = torch.ones_like(p)
    other.step()
    assert other.state[double[0].weight]["step"].item() == 2
    assert torch.equal(saved["state"][0]["step"], step_before)


def _damaged(change) -> dict:
    net = _network()
    opt = AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    _step(net, opt, 0)
    state = opt.state_dict()
    change(state)
    return state


def _fewer_params(s):
    s["param_groups"][0]["params"].pop()


def _two_groups(s):
    s["param_groups"].append(dict(s["param_groups"][0]))


def _wrong_shape(s):
    s["state"][0]["exp_avg"] = torch.zeros(3)


def _amsgrad(s):
    s["param_groups"][0]["amsgrad"] = True


def _no_moments(s):
    del s["state"][1]["exp_avg_sq"]


def _unknown_param(s):
    s["state"][99] = s["state"][0]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_fewer_params, "holds 5 parameters, this network has 6"),
        (_two_groups, "has 2 parameter groups"),
        (_wrong_shape, "exp_avg of parameter 0 has shape (3,), the parameter (8, 6)"),
        (_amsgrad, "not plain AdamW's"),
        (_no_moments, "parameter 1 lacks ['exp_avg_sq']"),
        (_unknown_param, "unknown parameter 99"),
    ],
)
def test_a_state_of_another_network_or_optimiser_is_refused_naming_why(change, reason):
    opt = AdamW(_network().parameters(), lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match="the optimiser state") as refused:
        opt.load_state_dict(_damaged(change))
    assert reason in str(refused.value)
    assert opt.state == {}


def test_the_loop_keeps_torch_adamw_on_cuda_only():
    net = _network()
    assert isinstance(loop_optimizer(net.parameters(), 1e-3, 0.0, torch.device("cpu")), AdamW)
    on_cuda = loop_optimizer(net.parameters(), 1e-3, 0.0, torch.device("cuda", 0))
    assert isinstance(on_cuda, torch.optim.AdamW)


# validation losses an early-stopped fit can see: improvements, a tie, tiny (below the relative
# threshold) and real gains, plateaus, a NaN epoch
LOSSES = [0.70, 0.65, 0.65, 0.66, 0.64, 0.639999, 0.64, 0.63, 0.62, 0.62, 0.62, 0.61, math.nan]
LOSSES += [0.61, 0.605, 0.6049999, 0.61, 0.62, 0.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    "arguments", [{"factor": 0.5, "patience": 1}, {"factor": 0.1, "patience": 0, "cooldown": 2}]
)
def test_the_plateau_schedule_decides_as_torch(arguments):
    """The loop's arguments (factor 0.5, patience 1) and a cooldown: the same learning rate after
    every epoch and the same state as torch's ReduceLROnPlateau."""
    theirs_opt = torch.optim.AdamW(_network().parameters(), lr=2e-3)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs_opt, **arguments)
    ours_opt = AdamW(_network().parameters(), lr=2e-3)
    ours = ReduceOnPlateau(ours_opt, **arguments)
    ours_lrs, torch_lrs = [], []
    for loss in LOSSES:
        ours.step(loss)
        theirs.step(loss)
        ours_lrs.append(ours_opt.param_groups[0]["lr"])
        torch_lrs.append(theirs_opt.param_groups[0]["lr"])
        assert ours.state_dict() == theirs.state_dict()
    assert ours_lrs == torch_lrs
    assert len(set(ours_lrs)) >= 3  # it did lower the rate, more than once
    assert ours.get_last_lr() == theirs.get_last_lr()


def test_a_plateau_state_continues_in_the_other_implementation():
    torch_opt = torch.optim.AdamW(_network().parameters(), lr=2e-3)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(torch_opt, factor=0.5, patience=1)
    for loss in LOSSES[:6]:
        theirs.step(loss)
    ours_opt = AdamW(_network().parameters(), lr=2e-3)
    ours_opt.param_groups[0]["lr"] = torch_opt.param_groups[0]["lr"]
    ours = ReduceOnPlateau(ours_opt, factor=0.9, patience=7)
    ours.load_state_dict(theirs.state_dict())
    back_opt = torch.optim.AdamW(_network().parameters(), lr=torch_opt.param_groups[0]["lr"])
    back = torch.optim.lr_scheduler.ReduceLROnPlateau(back_opt)
    back.load_state_dict(ours.state_dict())
    for loss in LOSSES[6:]:
        theirs.step(loss)
        ours.step(loss)
        back.step(loss)
        lrs = {o.param_groups[0]["lr"] for o in (torch_opt, ours_opt, back_opt)}
        assert len(lrs) == 1, lrs


def test_a_plateau_state_of_another_schedule_is_refused_naming_why():
    opt = AdamW(_network().parameters(), lr=2e-3)
    schedule = ReduceOnPlateau(opt, factor=0.5, patience=1)
    maximising = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.AdamW(_network().parameters()), mode="max"
    )
    with pytest.raises(ValueError, match="in mode 'max'"):
        schedule.load_state_dict(maximising.state_dict())
    stepwise = torch.optim.lr_scheduler.StepLR(torch.optim.AdamW(_network().parameters()), 3)
    with pytest.raises(ValueError, match="lacks .*not a plateau schedule's"):
        schedule.load_state_dict(stepwise.state_dict())
    assert schedule.state_dict() == ReduceOnPlateau(opt, factor=0.5, patience=1).state_dict()
