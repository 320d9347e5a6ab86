"""A plain training loop for the peer comparison: the neutral timer, and the command ZenithTune tunes.

It trains one of autotune's workloads (the recipe's model, dataset, optimizer and loss, built as a trial builds them)
the way a user's own script would: a DataLoader, an optional autocast, forward, backward, step. The configuration
comes from exactly one place, and nothing else is tuned behind its back:

    --config RESULT.yaml   an autotune result, applied through the public API a user calls (load_config, then
                           dataloader_kwargs, apply_backend_flags, autocast, compile_kwargs)
    --config PLAIN.json    a plain setting (batch, workers, prefetch, persistent, pin, threads, precision, compile),
                           as peers.py writes every other tool's recommendation
    flags                  the same plain setting as command-line flags (ZenithTune's search space)

Throughput is end to end (the data wait included): samples over the wall time of the timed steps, after untimed
warm-up steps. Five by default: on a CPU with AMX, bf16's first steps run several times slower than its settled ones
(oneDNN builds its kernels as they are first met: 4, 10, 4, 2.5, then 1.9 s a step for CAM++ at batch 16, against
fp32's settled 1.9-2.7 s), so one warm-up step ranks bf16 below fp32 when it is not.

The timed span is `--seconds`, except for a length-sorted workload (the conformer: WeNet sorts each window of
`sort_size` shuffled utterances by length and batches the sorted run, so batches go from the shortest clips to the
longest), timed over one sort window's worth of samples: a span of seconds holds whichever lengths it reached, which
after a few warm-up steps are the shortest clips of the first window, a rate no whole epoch reaches; a span of
`sort_size` samples covers every length about once, whatever the batch.

The share of the CPU other processes took during the timed steps is measured too (autotune's machine/cpu_load.py), so
a reader can tell a measurement someone else's job disturbed. It prints one `throughput: X samples/s` line (ZenithTune's
regex reads it) and one JSON line.

    .venv/bin/python benchmarks/peers_train.py --data-file DATA.json --config PLAIN.json --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

PLAIN_KEYS = (
    "batch_size",
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "threads",
    "precision",
)


@dataclass(kw_only=True)
class Applied:
    """One configuration as a training script applies it: the knobs for the workload, DataLoader, process and step."""

    config: Any  # autotune's TrialConfig: what the workload's build reads (batch, feature placement, preload)
    loader_kwargs: dict[str, Any]
    set_process: Callable[[], Any]
    autocast: Callable[[], contextlib.AbstractContextManager[Any]]
    compile_kwargs: dict[str, Any] | None = None
    label: dict[str, Any] = field(default_factory=dict)


def from_result(path: str) -> Applied:
    """An autotune result, through the calls its YAML header tells a user to make."""
    from autotune import load_config

    tuned = load_config(path)
    return Applied(
        config=tuned.config,
        loader_kwargs=tuned.dataloader_kwargs(),
        set_process=tuned.apply_backend_flags,
        autocast=tuned.autocast,
        compile_kwargs=tuned.compile_kwargs(),
        label={"result": Path(path).name, "config": tuned.config.short()},
    )


def from_plain(plain: dict[str, Any]) -> Applied:
    """A plain setting: DataLoader arguments, torch.set_num_threads and torch.autocast, as scripts set them."""
    import torch

    from autotune.knobs.config import TrialConfig

    workers = int(plain.get("num_workers") or 0)
    kwargs: dict[str, Any] = {
        "batch_size": int(plain["batch_size"]),
        "num_workers": workers,
        "pin_memory": bool(plain.get("pin_memory")),
        "drop_last": True,
    }
    if workers > 0:  # DataLoader refuses worker options without workers
        kwargs["persistent_workers"] = bool(plain.get("persistent_workers"))
        if plain.get("prefetch_factor"):
            kwargs["prefetch_factor"] = int(plain["prefetch_factor"])
    threads = plain.get("threads")
    bf16 = plain.get("precision") == "bf16"

    def set_process() -> None:
        if threads:
            torch.set_num_threads(int(threads))

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    return Applied(
        config=TrialConfig(per_device_batch_size=int(plain["batch_size"]), num_workers=workers),
        loader_kwargs=kwargs,
        set_process=set_process,
        autocast=autocast,
        compile_kwargs={} if plain.get("compile") else None,
        label=plain,
    )


def build(model: str, data_file: str, options: dict[str, Any], config: Any) -> Any:
    """The workload's TrainingSetup on the CPU, as a trial builds it (same data list, options and seed)."""
    import torch

    from autotune import workloads, yamlio
    from autotune.data import DataSource
    from autotune.workloads.base import WorkloadContext

    workload = workloads.get(model)
    data = DataSource.from_dict(yamlio.read_json(data_file))
    torch.manual_seed(0)
    merged = {**workload.options, **options}
    context = WorkloadContext(data=data, config=config, options=merged, device=torch.device("cpu"))
    setup = workload.build(context)
    setup.model.train()
    return setup


def loader_for(setup: Any, applied: Applied) -> Any:
    """The DataLoader: shuffled batches of the configured size, or the workload's own length batches if it has them."""
    import torch

    kwargs = dict(applied.loader_kwargs)
    if setup.batch_sampler_factory is not None:  # length-batched recipes (the conformer) form their own batches
        generator = torch.Generator().manual_seed(0)
        batches = list(setup.batch_sampler_factory(applied.config, generator, range(len(setup.dataset))))
        for key in ("batch_size", "drop_last", "shuffle"):
            kwargs.pop(key, None)
        return torch.utils.data.DataLoader(setup.dataset, batch_sampler=batches, collate_fn=setup.collate_fn, **kwargs)
    return torch.utils.data.DataLoader(setup.dataset, shuffle=True, collate_fn=setup.collate_fn, **kwargs)


def batches_forever(loader: Any) -> Iterator[Any]:
    while True:  # the next epoch starts where a user's loop would start it
        yield from loader


def sort_window(model: str, options: dict[str, Any]) -> int:
    """Samples in one of the workload's length-sorted windows; 0 where its batches are not formed by sorting."""
    from autotune import workloads

    return int({**workloads.get(model).options, **options}.get("sort_size") or 0)


def train(
    setup: Any, applied: Applied, warmup_steps: int, seconds: float, steps: int, span_samples: int = 0
) -> dict[str, Any]:
    """Warm-up steps untimed, then timed steps until `steps` are done (when given), `span_samples` are trained (when
    given) or `seconds` have passed."""
    import torch

    model = setup.model
    if applied.compile_kwargs is not None:
        model.compile(**applied.compile_kwargs)
    optimizer = setup.optimizer
    device = torch.device("cpu")
    from autotune.machine.cpu_load import cpu_sample, others_fraction

    samples = done = 0
    started = time.perf_counter()
    before = cpu_sample()
    for step, batch in enumerate(batches_forever(loader_for(setup, applied))):
        if step == warmup_steps:
            started, samples, done, before = time.perf_counter(), 0, 0, cpu_sample()
        batch = setup.batch_to_device(batch, device, False)
        with applied.autocast():
            loss = setup.loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        samples += setup.samples_in(batch)
        done += 1
        elapsed = time.perf_counter() - started
        if step < warmup_steps:
            continue
        if steps:
            if done >= steps:
                break
        elif span_samples:
            if samples >= span_samples:
                break
        elif elapsed >= seconds:
            break
    others = others_fraction(before, cpu_sample())
    return {
        "samples_per_second": samples / elapsed,
        "timed_steps": done,
        "timed_samples": samples,
        "timed_s": round(elapsed, 2),
        "others_cpu_fraction": None if others is None else round(others, 3),
    }


def plain_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {key: getattr(args, key) for key in PLAIN_KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cam++")
    parser.add_argument("--data-file", required=True, help="the data list as JSON (DataSource.to_dict)")
    parser.add_argument("--option", action="append", default=[], help="workload option KEY=JSON, as autotune run")
    parser.add_argument("--config", default=None, help="an autotune result YAML or a plain-setting JSON")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=30.0, help="timed wall seconds (unless --steps)")
    parser.add_argument("--steps", type=int, default=0, help="timed steps instead of --seconds")
    parser.add_argument(
        "--span",
        choices=("auto", "seconds"),
        default="auto",
        help="auto: a length-sorted workload is timed over one sort window's samples, others over --seconds",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--prefetch-factor", type=int, default=None)
    parser.add_argument("--persistent-workers", type=int, default=0)
    parser.add_argument("--pin-memory", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    options = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.option)}
    if args.config and args.config.endswith((".yaml", ".yml")):
        applied = from_result(args.config)
    elif args.config:
        applied = from_plain(json.loads(Path(args.config).read_text(encoding="utf-8")))
    else:
        applied = from_plain(plain_from_flags(args))
    applied.set_process()  # before any tensor work, as a training script sets its threads first
    setup = build(args.model, args.data_file, options, applied.config)
    span = sort_window(args.model, options) if args.span == "auto" and setup.batch_sampler_factory else 0
    measured = train(setup, applied, args.warmup_steps, args.seconds, args.steps, span)
    print(f"throughput: {measured['samples_per_second']:.3f} samples/s", flush=True)
    print(json.dumps({**measured, "config": applied.label}), flush=True)


if __name__ == "__main__":
    main()
