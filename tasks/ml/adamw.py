"""The training loop's optimiser: AdamW without ``torch.optim`` on the CPU.

``torch.optim.Optimizer`` imports ``torch._dynamo`` when it is built (``add_param_group`` is
wrapped to disable dynamo) and on every ``step`` (``_use_grad``): 1.2-1.3 s of CPU in a process
that would otherwise never load it, a seventh of a small run that fits a network
(``TORCHDYNAMO_DISABLE=1`` still loads it). :class:`AdamW` is torch's update rule for the loop's
arguments (decoupled weight decay, ``amsgrad=False``, ``maximize=False``), operation for
operation as torch's single-tensor path (the one torch takes for CPU parameters), so it gives
the same weights bit for bit; its ``param_groups`` and ``state_dict`` are torch's, so a
checkpoint written with ``torch.optim.AdamW`` resumes with it and the other way round.

On CUDA the loop keeps ``torch.optim.AdamW`` (:func:`loop_optimizer`): there torch steps every
parameter in one multi-tensor kernel launch per operation instead of one per parameter, the
import is small beside CUDA's own start-up, and ``torch.compile`` (on by default on CUDA) loads
dynamo anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

# torch.optim.AdamW's param_group keys besides lr, betas, eps, weight_decay and params, with the
# values that select the update rule implemented here
_FIXED_FLAGS: dict[str, Any] = {
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": True,
}
_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
_MOMENTS = ("exp_avg", "exp_avg_sq")


class Optimiser(Protocol):
    """What the training loop asks of an optimiser (torch's and :class:`AdamW` both are one)."""

    param_groups: list[dict[str, Any]]

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def loop_optimizer(
    params: Iterable[nn.Parameter], lr: float, weight_decay: float, device: torch.device
) -> Optimiser:
    """The training loop's AdamW: :class:`AdamW` on the CPU, ``torch.optim.AdamW`` on CUDA
    (its multi-tensor kernels; see the module's docstring). Both read each other's state."""
    if device.type == "cuda":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return AdamW(params, lr=lr, weight_decay=weight_decay)


class AdamW:
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay)`` (``amsgrad=False``) as one
    parameter group, with torch's ``param_groups``, per-parameter ``state`` (``step`` a float32
    CPU scalar tensor, ``exp_avg``, ``exp_avg_sq``) and ``state_dict`` format."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("AdamW got an empty parameter list")
        if not all(p.is_floating_point() and not p.is_complex() for p in params):
            raise ValueError("AdamW here steps real floating-point parameters only")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("AdamW got a parameter more than once")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"AdamW's lr, eps and weight_decay must be >= 0 and its betas in [0, 1) "
                f"(got lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas})"
            )
        self.param_groups: list[dict[str, Any]] = [
            {
                "lr": lr,
                "betas": (float(betas[0]), float(betas[1])),
                "eps": eps,
                "weight_decay": weight_decay,
                **_FIXED_FLAGS,
                "params": params,
            }
        ]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step of every parameter that has a gradient (those without one keep their
        value and moments, and their step count, as in torch)."""
        for group in self.param_groups:
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if grad.is_sparse:
                    raise RuntimeError("AdamW does not step sparse gradients")
                state = self.state.get(param)
                if not state:
                    state = self.state[param] = _fresh_state(param)
                exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                # torch.optim.adam._single_tensor_adam, decoupled weight decay, amsgrad off
                step_t += 1
                if weight_decay != 0:
                    param.mul_(1 - lr * weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """torch's optimiser state dict: parameters by their index across the groups."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed = {k: v for k, v in group.items() if k != "params"}
            groups.append(packed | {"params": [index[id(p)] for p in group["params"]]})
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` (this class's or ``torch.optim.AdamW``'s): its
        hyperparameters and moments, cast to each parameter's dtype and device. ValueError
        naming the mismatch when it is not an AdamW state of these parameters."""
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the optimiser state has {len(saved_groups)} parameter groups, "
                f"this network's optimiser has {len(self.param_groups)}"
            )
        by_index: dict[Any, torch.Tensor] = {}
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"the optimiser state holds {len(saved['params'])} parameters, "
                    f"this network has {len(group['params'])}"
                )
            other = {k: saved.get(k, v) for k, v in _FIXED_FLAGS.items() if k != "foreach"}
            if other["amsgrad"] or other["maximize"] or not other["decoupled_weight_decay"]:
                raise ValueError(
                    "the optimiser state is not plain AdamW's (amsgrad, maximize or coupled "
                    "weight decay set)"
                )
            by_index.update(zip(saved["params"], group["params"], strict=True))
        state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for key, values in saved_state.items():
            if key not in by_index:
                raise ValueError(f"the optimiser state has moments of an unknown parameter {key}")
            param = by_index[key]
            missing = [k for k in ("step", *_MOMENTS) if k not in values]
            if missing:
                raise ValueError(f"the optimiser state of parameter {key} lacks {missing}")
            for k in _MOMENTS:
                if tuple(values[k].shape) != tuple(param.shape):
                    raise ValueError(
                        f"the optimiser state's {k} of parameter {key} has shape "
                        f"{tuple(values[k].shape)}, the parameter {tuple(param.shape)}"
                    )
            state[param] = {  # copies: stepping never writes into the loaded checkpoint
                "step": torch.tensor(float(values["step"]), dtype=_scalar_dtype()),
                **{
                    k: values[k].detach().to(param.device, param.dtype, copy=True) for k in _MOMENTS
                },
            }
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            for k in _HYPERPARAMETERS:
                group[k] = tuple(saved[k]) if k == "betas" else saved[k]
        self.state = state


def _scalar_dtype() -> torch.dtype:
    """The dtype of torch's (non-fused) ``step`` counters."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _fresh_state(param: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "step": torch.tensor(0.0, dtype=_scalar_dtype()),
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }
