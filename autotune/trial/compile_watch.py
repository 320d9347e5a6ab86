"""What compiling cost a trial: which of its steps compiled (the first, and each recompile for a new shape), how long
they took beyond a steady step, and how many graphs were compiled.

A step "compiled" when torch recorded compile work during it: dynamo's and inductor's timing records
(torch._dynamo.utils.compilation_time_metrics) grew, which covers the forward's compile and the backward's (compiled
lazily at the first backward under dynamic shapes), or dynamo compiled a new graph (counters["stats"]
["unique_graphs"]). Reading both is two dict lookups: cheap enough for every step.

The cost charged is wall time, not torch's own compile timers: a compiling step's time minus a steady step's, so
that everything the user waits for (tracing, lowering, the C++ or Triton compiler, a lazily compiled backward,
autotuning) is counted, and nothing of the step's own work. A compiling step in the timed window is taken out of it
(its seconds and samples), so that the window is steady-state throughput, and its cost is added to the compile cost
instead (trial/loop.py). Recompiles are the compiling steps after the first: new input shapes (or a graph break's new
frame) that the specialised graphs did not cover.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CompileWatch", "CompileCost"]


def _activity() -> tuple[int, int]:
    """(compile timing records so far, graphs compiled so far) in this process; (0, 0) without dynamo."""
    try:
        from torch._dynamo import utils
    except ImportError:
        return 0, 0
    metrics = getattr(utils, "compilation_time_metrics", {})
    records = sum(len(values) for values in metrics.values())
    graphs = int(utils.counters["stats"].get("unique_graphs", 0))
    return records, graphs


@dataclass(kw_only=True, slots=True)
class CompileCost:
    """A trial's compiling steps, and what they cost beyond a steady step."""

    step_times_s: list[float] = field(default_factory=list)  # each compiling step's wall time
    graphs: int = 0  # graphs dynamo compiled during the trial's steps

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    @property
    def recompiles(self) -> int:
        """Compiling steps after the first one."""
        return max(0, self.steps - 1)

    def seconds(self, steady_step_s: float) -> float:
        """The compiling steps' time beyond what they would have taken as steady steps."""
        return sum(max(0.0, step_s - steady_step_s) for step_s in self.step_times_s)

    def summary(self, steady_step_times_s: Sequence[float]) -> dict[str, float | int]:
        """The trial result's compile figures, against the median of the steady (non-compiling) steps."""
        steady = statistics.median(steady_step_times_s) if steady_step_times_s else 0.0
        return {"compile_s": self.seconds(steady), "recompiles": self.recompiles, "compiled_graphs": self.graphs}


class CompileWatch:
    """Tells, step by step, whether a step compiled; collects the compiling steps' times.

    Off (compiling=False: an eager trial) it reads nothing and every step is an ordinary one.
    """

    def __init__(self, compiling: bool) -> None:
        self.compiling = compiling
        self.cost = CompileCost()
        self._before = _activity() if compiling else (0, 0)
        self._graphs_at_start = self._before[1]

    def step_compiled(self, step_s: float) -> bool:
        """Whether compile work happened since the last call; if so, the step's time goes to the compile cost."""
        if not self.compiling:
            return False
        now = _activity()
        compiled = now != self._before
        self._before = now
        self.cost.graphs = now[1] - self._graphs_at_start
        if compiled:
            self.cost.step_times_s.append(step_s)
        return compiled
