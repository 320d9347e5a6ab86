"""Several optimizers stepped as one, for recipes that give each group of modules its own (SpeechBrain's
``optimizers_dict``): the trial loop and its GradScaler step one optimizer, and this is one.

Imported inside workloads' build functions only: it needs torch at import, and importing autotune must not load it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

__all__ = ["OptimizerSet"]


class OptimizerSet(torch.optim.Optimizer):
    """The member optimizers, each over its own parameters, stepped and zeroed together.

    ``param_groups`` are the members' own group dicts (a learning rate set here is set there), so a GradScaler
    unscales and checks every member's gradients before ``step`` runs them all; ``state`` is one mapping the members
    write into (their parameters are disjoint), so it fills as theirs does. Each member keeps its own step hooks.

    Args:
        optimizers: the members, in the order they step; no parameter may belong to two.
    """

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        if not optimizers:
            raise ValueError("an OptimizerSet needs at least one optimizer")
        params = [param for member in optimizers for group in member.param_groups for param in group["params"]]
        super().__init__(params, {})  # refuses a parameter given twice
        self.optimizers = optimizers
        self.param_groups = [group for member in optimizers for group in member.param_groups]
        shared: defaultdict[torch.Tensor, Any] = defaultdict(dict)
        for member in optimizers:
            shared.update(member.state)
            member.state = shared
        self.state = shared

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("an OptimizerSet steps without a closure")
        for member in self.optimizers:
            member.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for member in self.optimizers:
            member.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [member.state_dict() for member in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict["optimizers"]
        if len(states) != len(self.optimizers):
            raise ValueError(f"state of {len(states)} optimizers given to a set of {len(self.optimizers)}")
        for member, state in zip(self.optimizers, states, strict=True):
            member.load_state_dict(state)
        shared: defaultdict[torch.Tensor, Any] = defaultdict(dict)
        for member in self.optimizers:  # loading gave each member a mapping of its own
            shared.update(member.state)
            member.state = shared
        self.state = shared
