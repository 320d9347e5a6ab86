"""The probe inside a training process: hooks set when torch is imported, one window measured, the result written,
the training ended at an optimizer-step boundary.

What it hooks, and why each is cheap enough to leave on for every step (benchmarks/probe_overhead.py measures it):
- torch's global optimizer step post-hook: one Python call per step. The clock follows the first optimizer that
  steps (a GAN's second optimizer steps once per iteration too, and would halve the step time).
- DataLoader iterators' __next__: two clock reads and the batch's first dimension per batch.
- Tensor.backward: the loss is added to a sum on its own device (no host sync); the sum is read once, at the end.
- DataLoader.__init__: its arguments and where the user built it, read once per loader; the knobs the user asked
  autotune to apply (ProbeSettings.apply) are set there.
- A global module forward pre-hook during the window's first step only: autocast and the backend flags in force
  inside the forward.
Ending: rank 0 decides the window's last step and every rank stops at it (window.py); after the step's optimizer
update, before the training's next line runs, each rank writes its result and leaves with os._exit(0). No checkpoint
code runs after that point, so none is left half-written; DataLoader workers die with the process group the parent
kills. A training that ends, or fails, before its window is measured leaves a note the parent reads (ENDED_SUFFIX).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import resource
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from autotune import yamlio
from autotune.probe.readback import LoaderSeen, batch_items, built_at, maths_in_force, observed_values
from autotune.probe.settings import PLAN_SUFFIX, ProbeSettings
from autotune.probe.window import StepClock
from autotune.trial.child import ProgressWriter
from autotune.trial.spec import LAUNCHED_AT_ENV, PROGRESS_SUFFIX, TrialResult, rank_result_path
from autotune.trial.window_record import throughput_cv

__all__ = ["ENDED_SUFFIX", "Session", "install"]

ENDED_SUFFIX = ".ended"  # beside a rank's result: the training ended (or raised) before its window was measured


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` right after the module `name` has been imported (its code has run)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real module, once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Start the probe in this process where PROBE_ENV asks for one: now if torch is imported, else when it is."""
    settings = ProbeSettings.from_environment()
    if settings is None:
        return
    if "torch" in sys.modules:
        _attach(settings, sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", lambda torch: _attach(settings, torch)))


def _attach(settings: ProbeSettings, torch: ModuleType) -> None:
    """The hooks, set on this torch; a probe that cannot set them says so and leaves the training alone."""
    try:
        _set_hooks(settings, torch)
    except Exception as error:  # noqa: BLE001 - the training must not fail because of us
        print(
            f"autotune probe: cannot hook this torch {torch.__version__}: {type(error).__name__}: {error}",
            file=sys.stderr,
        )


def _set_hooks(settings: ProbeSettings, torch: ModuleType) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader

    session = Session(settings, torch)
    register_optimizer_step_post_hook(session.on_optimizer_step)
    loader_class, iterator_class = dataloader.DataLoader, dataloader._BaseDataLoaderIter
    original_init, original_iterator = loader_class.__init__, loader_class._get_iterator
    original_next, original_backward = iterator_class.__next__, torch.Tensor.backward
    signature = inspect.signature(original_init)

    # functools.wraps: whoever inspects these sees the originals' signatures (Lightning's DataLoader re-creation
    # reads DataLoader.__init__'s parameters to find the dataset argument).
    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - it replaces DataLoader.__init__
        if settings.apply:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            _apply_loader_knobs(bound.arguments, settings.apply)
            args, kwargs = bound.args[1:], bound.kwargs
        original_init(self, *args, **kwargs)
        session.on_loader_built(self)

    @functools.wraps(original_iterator)
    def _get_iterator(self: Any) -> Any:
        iterator: Any = original_iterator(self)
        iterator._autotune_loader = self
        return iterator

    @functools.wraps(original_next)
    def __next__(self: Any) -> Any:  # noqa: N807
        started = time.perf_counter()
        batch = original_next(self)
        session.on_batch(self, batch, time.perf_counter() - started)
        return batch

    @functools.wraps(original_backward)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        session.on_loss(self)
        return original_backward(self, *args, **kwargs)

    loader_class.__init__ = __init__  # type: ignore[method-assign]
    loader_class._get_iterator = _get_iterator  # type: ignore[method-assign]
    iterator_class.__next__ = __next__  # type: ignore[method-assign]
    torch.Tensor.backward = backward
    atexit.register(session.on_exit)
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        session.on_exception(error)
        previous_hook(kind, error, trace)

    sys.excepthook = excepthook


def _apply_loader_knobs(arguments: dict[str, Any], apply: dict[str, Any]) -> None:
    """Set the asked DataLoader arguments; those that need workers only where the loader has them (torch refuses a
    prefetch_factor or persistent workers without)."""
    for name in ("num_workers", "pin_memory"):
        if name in apply:
            arguments[name] = apply[name]
    workers = int(arguments.get("num_workers") or 0)
    for name in ("prefetch_factor", "persistent_workers"):
        if name in apply:
            arguments[name] = apply[name] if workers > 0 else (None if name == "prefetch_factor" else False)


class Session:
    """One process's measurement: the clock, the loaders seen, the maths in force, the losses."""

    def __init__(self, settings: ProbeSettings, torch: ModuleType) -> None:
        self.settings, self.torch = settings, torch
        self.started_at = time.perf_counter()
        self._clock: StepClock | None = None
        self.rank, self.world_size = 0, 1
        self.result_path = settings.result_path
        self.loaders: dict[int, LoaderSeen] = {}
        self.maths: dict[str, Any] | None = None
        self.loss_sum: Any = None
        self.optimizer_id: int | None = None  # the optimizer the clock follows
        self.first_batch_at: float | None = None
        self.exception: tuple[str, str] | None = None
        self._maths_hook: Any = None
        self._progress_writer: ProgressWriter | None = None
        self._warmup_items = 0
        self.training_loaders: set[int] = set()  # loaders an optimizer step followed a batch of (on_optimizer_step)
        self._last_loader: int | None = None

    @property
    def clock(self) -> StepClock:
        """The clock, made at the first batch or step: by then a distributed training has its process group, whose
        rank this process is (a launcher's environment says it otherwise: torchrun's RANK, Lightning's LOCAL_RANK)."""
        if self._clock is None:
            self.rank, self.world_size = self._place()
            self.result_path = rank_result_path(self.settings.result_path, self.rank)
            cuda = self.settings.device_type == "cuda"
            self._clock = StepClock(
                timing=self.settings.timing,
                rank=self.rank,
                world_size=self.world_size,
                plan_path=self.settings.result_path + PLAN_SUFFIX,
                spent_before_s=self._since_launch,
                synchronize=self._synchronize if cuda else None,
                require_settled=cuda or self.world_size > 1,
            )
        return self._clock

    def _place(self) -> tuple[int, int]:
        distributed = self.torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return int(distributed.get_rank()), int(distributed.get_world_size())
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        return int(rank), int(os.environ.get("WORLD_SIZE", "1"))

    def _since_launch(self) -> float:
        launched_at = os.environ.get(LAUNCHED_AT_ENV)
        return max(0.0, time.time() - float(launched_at)) if launched_at else time.perf_counter() - self.started_at

    def _synchronize(self) -> None:
        if self.torch.cuda.is_initialized():
            self.torch.cuda.synchronize()

    def on_loader_built(self, loader: Any) -> None:
        self.loaders[id(loader)] = LoaderSeen.of(loader, built_at())

    def on_batch(self, iterator: Any, batch: Any, wait_s: float) -> None:
        if self.first_batch_at is None:
            self.first_batch_at = time.perf_counter()
        loader = id(getattr(iterator, "_autotune_loader", None))
        self._last_loader = loader
        if self.training_loaders and loader not in self.training_loaders and loader in self.loaders:
            # A loader no optimizer step has followed yet (a validation pass inside the training's epoch, WeNet's
            # cv_data): its batches are not training samples. Its time stays in the window: the training spends it.
            return
        items = batch_items(batch)
        self.clock.on_batch(items, wait_s)
        if self.clock.phase == "warmup":
            self._warmup_items += items
        if self.clock.phase == "window":
            seen = self.loaders.get(id(getattr(iterator, "_autotune_loader", None)))
            if seen is not None:
                seen.window_batches += 1
                seen.window_items.append(items)

    def on_loss(self, loss: Any) -> None:
        if (self._clock is None or self._clock.phase != "done") and loss.numel() == 1 and loss.is_floating_point():
            value = loss.detach().float().reshape(())
            self.loss_sum = value if self.loss_sum is None else self.loss_sum + value

    def on_exception(self, error: BaseException) -> None:
        from autotune.trial.child import classify_exception

        self.exception = classify_exception(error)

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        elif id(optimizer) != self.optimizer_id:
            return
        if self._last_loader is not None and self._last_loader in self.loaders:
            self.training_loaders.add(self._last_loader)
        before = self.clock.phase
        phase = self.clock.on_step()
        if phase != "done":
            self._progress(phase)
        if self._maths_hook is not None and self.maths is not None:
            self._maths_hook.remove()
            self._maths_hook = None
        if before == "warmup" and phase == "window":
            self._watch_maths()
        if phase == "done":
            self._finish()

    def _watch_maths(self) -> None:
        """Autocast and the flags as the window's first step's modules see them: the union over its forwards (a
        feature module may run before autocast is entered)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        def seen(module: Any, args: Any) -> None:
            now = maths_in_force(self.torch)
            if self.maths is None:
                self.maths = now
            else:
                self.maths["autocast"].update(now["autocast"])

        self._maths_hook = register_module_forward_pre_hook(seen)

    def _progress(self, phase: str) -> None:
        """Rank 0 tells the parent how the training is going, as a trial's child does (for the first step's news and
        for pruning): the rate so far, in the window its own, times the ranks (trial/child.py ProgressWriter)."""
        if self.rank != 0:
            return
        if self._progress_writer is None:
            self._progress_writer = ProgressWriter(self.result_path + PROGRESS_SUFFIX, scale=self.world_size)
        now, clock = time.perf_counter(), self.clock
        if phase == "window":
            elapsed, samples = now - clock.window.started_at, clock.window.samples
            if not samples:
                return  # the step that opened the window: no window step is timed yet, its rate would read 0
        else:
            elapsed, samples = now - (self.first_batch_at or self.started_at), self._warmup_items
        self._progress_writer(phase, samples / elapsed if elapsed > 0 else 0.0, elapsed)

    def _training_loader(self) -> LoaderSeen | None:
        seen = [loader for loader in self.loaders.values() if loader.window_batches]
        return max(seen, key=lambda loader: loader.window_batches) if seen else None

    def result(self) -> TrialResult:
        """This rank's result, after its window."""
        clock, window = self.clock, self.clock.window
        loader = self._training_loader()
        finite = None if self.loss_sum is None else bool(self.torch.isfinite(self.loss_sum).item())
        observed = observed_values(
            loader,
            self.maths,
            steps=len(window.step_times_s),
            batches=window.batches,
            device_type=self.settings.device_type,
        )
        observed["world_size"] = self.world_size
        times = sorted(window.step_times_s)
        rate = window.samples / window.window_s if window.window_s > 0 else 0.0
        epoch = dict(loader.epoch, built_at=loader.built_at) if loader is not None else None
        return TrialResult(
            status="ok" if finite is not False else "nonfinite",
            reason="" if finite is not False else "a loss given to backward was not finite (inf or NaN)",
            samples_per_second=rate,
            window_samples_per_second=rate,
            step_time_median_s=times[len(times) // 2] if times else None,
            step_time_p90_s=times[min(len(times) - 1, int(0.9 * len(times)))] if times else None,
            throughput_cv=throughput_cv(window.step_times_s, window.step_items),
            data_wait_fraction=window.data_wait_s / window.window_s if window.window_s > 0 else None,
            peak_memory_bytes=self._peak_memory_bytes(),
            all_losses_finite=finite,
            window_steps=len(window.step_times_s),
            window_s=window.window_s,
            warmup_s=sum(clock.warmup_times_s),
            warmup_steps=len(clock.warmup_times_s),
            warmup_first_steps_s=[round(value, 4) for value in clock.warmup_times_s[:5]],
            trimmed_steps=clock.trimmed_steps,
            start_s=self._since_launch() - (time.perf_counter() - self.started_at),
            setup_s=(self.first_batch_at or self.started_at) - self.started_at,
            world_size=self.world_size,
            per_rank_samples_per_second=[rate],
            epoch_accounting=epoch,
            fp32_math=self.maths["fp32_math"] if self.maths and self.settings.device_type == "cuda" else None,
            observed=observed,
        )

    def _peak_memory_bytes(self) -> int:
        if self.settings.device_type == "cuda" and self.torch.cuda.is_initialized():
            return int(self.torch.cuda.max_memory_allocated())
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB

    def _finish(self) -> None:
        yamlio.write_json(self.result_path, self.result().to_dict())
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)

    def _empty_loader(self) -> dict[str, Any] | None:
        """A DataLoader this process built whose epoch holds no batch (a batch larger than the data with drop_last, or
        no data): why a training can end without a step, said where the loader was built."""
        for loader in self.loaders.values():
            if loader.epoch.get("batches_per_epoch") == 0:
                return {
                    "built_at": loader.built_at,
                    "dataset_size": loader.epoch.get("dataset_size"),
                    "batch_size": loader.arguments.get("batch_size"),
                    "sampler": loader.epoch.get("sampler"),
                }
        return None

    def on_exit(self) -> None:
        """The training ended without the probe ending it: say where it was (or what it raised), for the parent."""
        steps, phase = (self._clock.steps, self._clock.phase) if self._clock is not None else (0, "warmup")
        empty = self._empty_loader() if steps == 0 else None
        if steps == 0 and self.exception is None and empty is None:
            return  # not a training process (torchrun's agent, a DataLoader worker) or no step at all: the parent says
        note: dict[str, Any] = {"steps": steps, "phase": phase}
        if empty is not None:  # the cause, whatever the training raised after its empty epoch
            note["empty_loader"] = empty
        if self.exception is not None:
            note["status"], note["reason"] = self.exception
        try:
            yamlio.write_json(self.result_path + ENDED_SUFFIX, note)
        except OSError:
            pass
