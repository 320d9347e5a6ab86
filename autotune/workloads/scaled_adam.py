"""ScaledAdam, the optimizer GPT-SoVITS's s1 trains with (icefall's, by Daniel Povey; GPT-SoVITS 48b1a01
``GPT_SoVITS/AR/modules/optim.py``), written here from its description, not copied.

What it does, per its docstring and step: an Adam-like update whose step for a tensor is scaled by that tensor's own
root-mean-square value (clamped below at ``param_min_rms``), so that every tensor changes by about the same relative
amount; a separate learning of each tensor's overall scale (``size_update_period`` steps of gradients with respect to
the scale, an Adam step on them at ``lr * scalar_lr_scale``, held when the rms leaves [param_min_rms, param_max_rms]);
plain Adam for one-element tensors (clamped to ``scalar_max``); momentum kept as a decaying parameter change
``delta`` (beta1) rather than a first moment; no first-moment bias correction; and clipping of the whole model's
gradient norm (each gradient times its tensor's rms) at ``clipping_scale`` times the median norm of the last
``clipping_update_period`` steps, no clipping before that many steps have been seen.

The reference stacks tensors of one shape into one batch per step to launch fewer kernels; this one steps each
tensor on its own (the same arithmetic, more and smaller kernels).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["ScaledAdam"]


class ScaledAdam(torch.optim.Optimizer):
    """ScaledAdam with the reference's defaults; GPT-SoVITS passes lr 0.01, betas (0.9, 0.95), clipping_scale 2.0 and
    clipping_update_period 1000 (t2s_lightning_module.py:124-132)."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 3e-2,
        clipping_scale: float | None = None,
        betas: tuple[float, float] = (0.9, 0.98),
        scalar_lr_scale: float = 0.1,
        eps: float = 1.0e-8,
        param_min_rms: float = 1.0e-5,
        param_max_rms: float = 3.0,
        scalar_max: float = 10.0,
        size_update_period: int = 4,
        clipping_update_period: int = 100,
    ) -> None:
        defaults = {
            "lr": lr,
            "clipping_scale": clipping_scale,
            "betas": betas,
            "scalar_lr_scale": scalar_lr_scale,
            "eps": eps,
            "param_min_rms": param_min_rms,
            "param_max_rms": param_max_rms,
            "scalar_max": scalar_max,
            "size_update_period": size_update_period,
            "clipping_update_period": clipping_update_period,
        }
        super().__init__(params, defaults)
        self.norms: dict[int, dict[str, Any]] = {}  # per group: the recent norms, the threshold

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for number, group in enumerate(self.param_groups):
            pairs = [(p, p.grad) for p in group["params"] if p.grad is not None]
            if not pairs:
                continue
            fresh = any(len(self.state[p]) == 0 for p, _ in pairs)
            scale = 1.0 if fresh else self._clip_factor(number, group, pairs)
            for p, grad in pairs:
                if len(self.state[p]) == 0:
                    self._init_state(group, p)
                self._step_one(group, p, grad if scale == 1.0 else grad * scale)
        return loss

    def _init_state(self, group: dict[str, Any], p: torch.Tensor) -> None:
        state = self.state[p]
        state["step"] = 0
        state["delta"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
        if p.numel() > 1:
            state["param_rms"] = p.pow(2).mean().sqrt().reshape(1)
            state["scale_exp_avg_sq"] = torch.zeros(1, device=p.device, dtype=p.dtype)
            state["scale_grads"] = torch.zeros(group["size_update_period"], device=p.device, dtype=p.dtype)

    def _clip_factor(self, number: int, group: dict[str, Any], pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """The factor (<= 1) every gradient is scaled by this step: none until a period of norms has been seen."""
        if group["clipping_scale"] is None:
            return 1.0
        period = group["clipping_update_period"]
        step = self.state[pairs[0][0]]["step"]
        squares = [
            grad.pow(2).sum() if p.numel() == 1 else (grad * self.state[p]["param_rms"]).pow(2).sum()
            for p, grad in pairs
        ]
        norm = torch.stack(squares).sum().sqrt()
        record = self.norms.setdefault(number, {"recent": torch.zeros(period, device=norm.device)})
        record["recent"][step % period] = norm
        if step % period == 0:
            median = record["recent"].sort().values[(period // 4) * 2].item()
            record["threshold"] = group["clipping_scale"] * median
        if step < period or "threshold" not in record:
            return 1.0
        return min(1.0, record["threshold"] / (norm.item() + 1.0e-20))

    def _step_one(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor) -> None:
        """One step of one tensor with its (clipped) gradient."""
        state = self.state[p]
        beta1 = group["betas"][0]
        step = state["step"]
        state["delta"].mul_(beta1)
        if p.numel() == 1:
            self._scalar_step(group, p, grad, state)
        else:
            period = group["size_update_period"]
            state["scale_grads"][step % period] = (p * grad).sum()
            if step % period == period - 1:
                state["param_rms"].copy_(p.pow(2).mean().sqrt())
                if step > 0:
                    self._scale_step(group, p, state)
            self._tensor_step(group, p, grad, state)
        state["step"] = step + 1

    def _scale_step(self, group: dict[str, Any], p: torch.Tensor, state: dict[str, Any]) -> None:
        """Learn the tensor's overall scale from the last period's gradients with respect to it."""
        beta1, beta2 = group["betas"]
        scale_grads = state["scale_grads"]
        period = scale_grads.shape[0]
        lr = group["lr"] * group["scalar_lr_scale"]
        decay = beta2**period  # one scale step per period: its second moment decays per period
        state["scale_exp_avg_sq"].mul_(decay).add_(scale_grads.pow(2).mean(), alpha=1 - decay)
        correction = 1 - decay ** ((state["step"] + 1) // period)
        change = -lr * correction**0.5 * scale_grads.sum() / (state["scale_exp_avg_sq"].sqrt() + group["eps"])
        rms = state["param_rms"]
        change = torch.where(rms < group["param_min_rms"], torch.zeros_like(change), change)
        change = torch.where(rms > group["param_max_rms"], torch.full_like(change, -lr * period), change)
        state["delta"].add_(p * change, alpha=1 - beta1)

    def _tensor_step(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        correction = 1 - beta2 ** (state["step"] + 1)
        if correction < 0.99:
            exp_avg_sq = exp_avg_sq / correction
        size = -group["lr"] * (1 - beta1) * state["param_rms"].clamp(min=group["param_min_rms"])
        state["delta"].add_(grad / (exp_avg_sq.sqrt() + group["eps"]) * size)
        p.add_(state["delta"])

    def _scalar_step(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        lr = group["lr"] * group["scalar_lr_scale"]
        exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq / (1 - beta2 ** (state["step"] + 1))).sqrt() + group["eps"]
        state["delta"].add_(grad / denom, alpha=-lr * (1 - beta1))
        p.clamp_(min=-group["scalar_max"], max=group["scalar_max"])
        p.add_(state["delta"])
