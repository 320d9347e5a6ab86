"""How much of this machine's CPU other processes take: a short calibration at the start of a run, and each timed
window's share.

A shared machine (other users' jobs, a CI runner, a VM whose host is oversubscribed) slows a trial's window and makes
it erratic for reasons that have nothing to do with the configuration. To tell the two apart the run measures who
else uses its CPUs. Linux /proc only: /proc/stat gives each CPU's busy time (steal included: a VM's host taking the
CPU is load too), counted on the CPUs this process may run on; /proc/<pid>/stat gives a process tree's own CPU time
(DataLoader workers included). Other processes' share of a stretch of time is the CPUs' busy time minus our tree's,
over the CPUs' time. Where /proc is missing the figures are None and nothing adapts.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "BUSY_OTHERS_FRACTION",
    "BUSY_WINDOW_FACTOR",
    "CpuSample",
    "MachineLoad",
    "calibrate",
    "cpu_sample",
    "measure_load",
    "others_fraction",
    "process_tree",
]

logger = logging.getLogger(__name__)

# Other processes taking at least this share of our CPUs make the machine "busy": the run lengthens its windows and
# does not condemn a configuration whose window they disturbed. An idle machine's daemons take about 1%.
BUSY_OTHERS_FRACTION = 0.2
BUSY_WINDOW_FACTOR = 2.0  # a busy machine's windows are this much longer: more of its noise averages out
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user already)


def _cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_s(cpus: set[int]) -> float | None:
    """Busy seconds since boot summed over these CPUs (from /proc/stat's cpuN lines)."""
    total, found = 0, False
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = [int(value) for value in rest.split()]
        total += sum(fields[index] for index in _BUSY_FIELDS if index < len(fields))
        found = True
    return total / _TICKS_PER_S if found else None


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(child) for child in task.read_text().split()]
        except (OSError, ValueError):
            continue  # the task ended while we looked
    return children


def process_tree(pid: int | None = None) -> list[int]:
    """A process and all its descendants (DataLoader workers included), from /proc; the process itself first."""
    pending, seen = [pid or os.getpid()], []
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.append(current)
        pending += _children(current)
    return seen


def _own_cpu_s(pid: int) -> float | None:
    """CPU seconds of the tree under pid: every live process's, plus what its reaped children used (cutime)."""
    total, found = 0, False
    for index, member in enumerate(process_tree(pid)):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited while we looked; its time moves into its parent's cutime
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        if index == 0:
            ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: children that have exited
        total += ticks
        found = True
    return total / _TICKS_PER_S if found else None


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuSample:
    """The CPUs' busy time and our process tree's CPU time at one moment."""

    at_s: float
    cpus: int
    busy_s: float | None
    own_s: float | None


def cpu_sample(pid: int | None = None) -> CpuSample:
    cpus = _cpus()
    return CpuSample(at_s=time.monotonic(), cpus=len(cpus), busy_s=_busy_s(cpus), own_s=_own_cpu_s(pid or os.getpid()))


def others_fraction(before: CpuSample, after: CpuSample, own_s: float | None = None) -> float | None:
    """Share of our CPUs' time that other processes used between two samples (0: the machine to ourselves).

    own_s: our CPU seconds in between when several process trees are ours (a multi-rank trial's ranks); default the
    sampled tree's.
    """
    if before.busy_s is None or after.busy_s is None:
        return None
    if own_s is None:
        if before.own_s is None or after.own_s is None:
            return None
        own_s = after.own_s - before.own_s
    span = (after.at_s - before.at_s) * after.cpus
    return min(1.0, max(0.0, (after.busy_s - before.busy_s - own_s) / span)) if span > 0 else None


@dataclass(frozen=True, kw_only=True, slots=True)
class MachineLoad:
    """The machine as the run found it: load average, other processes' CPU share, a fixed kernel's steadiness."""

    cores: int
    load_average: float | None  # 1-minute, as uptime prints it (our own earlier work is in it too)
    others_cpu_fraction: float | None  # during the calibration, while the kernel tried to use every core
    kernel_spread_fraction: float | None  # (p90 - p10) / median of the kernel's rate over 0.1-s chunks
    seconds: float
    calibrations: int = 1  # measure_load: the quieter of this many

    @property
    def busy(self) -> bool:
        return self.others_cpu_fraction is not None and self.others_cpu_fraction >= BUSY_OTHERS_FRACTION

    @property
    def free_cores(self) -> int:
        """The cores other processes left during the calibration, rounded, at least one."""
        if self.others_cpu_fraction is None:
            return self.cores
        return max(1, min(self.cores, round(self.cores * (1.0 - self.others_cpu_fraction))))

    def describe(self) -> str:
        load = f"load average {self.load_average:.1f} on {self.cores} cores" if self.load_average is not None else ""
        parts = [load] if load else []
        if self.others_cpu_fraction is not None:
            during = (
                f"the quieter of {self.calibrations} calibrations of {self.seconds:.1f} s"
                if self.calibrations > 1
                else f"a {self.seconds:.1f}-s calibration"
            )
            parts.append(f"other processes took {self.others_cpu_fraction:.0%} of the CPU during {during}")
        if self.kernel_spread_fraction is not None:
            parts.append(f"a fixed kernel's speed varied {self.kernel_spread_fraction:.0%}")
        return "; ".join(parts) or "no load figures on this OS"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy": self.busy}


def calibrate(seconds: float = 1.0) -> MachineLoad:
    """Run a fixed compute kernel on every core for `seconds` (matrix products, in 0.1-s chunks) while sampling who
    else used the CPUs. The parent runs it before the first trial; it trains nothing and never touches a GPU."""
    import torch

    cores = len(_cpus())
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    left, right = torch.randn(256, 256), torch.randn(256, 256)
    rates: list[float] = []
    try:
        before = cpu_sample()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            chunk_start, products = time.perf_counter(), 0
            while time.perf_counter() - chunk_start < 0.1:
                torch.mm(left, right)
                products += 1
            rates.append(products / (time.perf_counter() - chunk_start))
        after = cpu_sample()
    finally:
        torch.set_num_threads(threads)
    spread = None
    if len(rates) >= 5:
        rates.sort()
        spread = (rates[int(0.9 * (len(rates) - 1))] - rates[int(0.1 * (len(rates) - 1))]) / statistics.median(rates)
    try:
        load_average: float | None = os.getloadavg()[0]
    except OSError:
        load_average = None
    load = MachineLoad(
        cores=cores,
        load_average=load_average,
        others_cpu_fraction=others_fraction(before, after),
        kernel_spread_fraction=spread,
        seconds=after.at_s - before.at_s,
    )
    logger.info("machine load: %s", load.describe())
    return load


def measure_load(seconds: float = 1.0) -> MachineLoad:
    """The calibration, taken a second time where it reads busy, the quieter reading standing.

    One reading sets the whole run's plan (longer windows, seeds on the free cores only), and a single second can
    catch what is over a moment later: another process starting up, the VM's host taking the CPU for a while. A load
    that lasts reads busy twice; a moment's reads busy once and costs one more second.
    """
    first = calibrate(seconds)
    if not first.busy:
        return first
    second = calibrate(seconds)
    quieter = min((first, second), key=lambda load: load.others_cpu_fraction or 0.0)
    logger.info("machine load, the first reading busy: %s, then %s", first.describe(), second.describe())
    return replace(quieter, calibrations=2)
