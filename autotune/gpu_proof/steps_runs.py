"""Proof steps through the user's commands: an OOM trial inside a real study, a full `autotune run --model cam++`
with its YAML and exports, and that YAML's `load_config` applied in a plain training loop."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from autotune.gpu_proof.registry import Proven, StepContext, child_environment, step, synchronize
from autotune.python_command import module_command

__all__ = ["OOM_BATCH", "RESULT_NAME", "autotune_command", "oom_batch", "result_figures", "study_verdict"]

OOM_BATCH = 2048  # the least batch the OOM study tries; a larger device gets a larger one (oom_batch)
# What a 3-s CAM++ sample costs the device at fp32 without checkpointing, model and cache included, rounded down (a
# lower figure makes the batch larger, never too small): bs=2048 peaked at 133 GiB on an H200 (benchmarks/gpu_proof.md)
OOM_SAMPLE_BYTES = 64 * 2**20
OOM_MARGIN = 1.5  # the huge batch needs this many times the device's memory: an OOM, not a near miss
RESULT_NAME = "cam++.yaml"
RUN_OVERHEAD_S = 60  # corpus check, process start, the final write: outside --budget
STOP_GRACE_S = 30  # a run stopped at its step's time writes its best so far within this
EXPORTS_S = 15  # the exports after the full run
EXPORT_TARGETS = ("3d-speaker", "lightning")


def autotune_command(*args: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ARGS` in a process of its own, output kept in files beside it (never a full pipe).

    At the timeout the command gets SIGTERM, which `autotune run` treats as Ctrl-C (the running trial stopped, the
    best so far written, exit 130), then STOP_GRACE_S to finish before it is killed: a run that overruns still leaves
    its result and its output for the report.
    """
    log = cwd / f"autotune-{args[0]}.log"
    with open(log, "w+", encoding="utf-8", errors="replace") as output:
        process = subprocess.Popen(
            module_command("autotune", *args),
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=child_environment(),
            text=True,
        )
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        output.seek(0)
        text = output.read()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout=text, stderr="")


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def oom_batch(device_memory_bytes: int | None) -> int:
    """A batch far too large for this device: the power of two from OOM_BATCH up whose samples need OOM_MARGIN times
    its memory (a fixed 2,048 fitted an H200's 140 GiB and was refused for headroom, not run out of memory)."""
    batch = OOM_BATCH
    while device_memory_bytes and batch * OOM_SAMPLE_BYTES < OOM_MARGIN * device_memory_bytes:
        batch *= 2
    return batch


def _device_memory_bytes(device: str) -> int | None:
    """The first GPU's memory as NVML reads it (no CUDA context in the step's process); None on a CPU rehearsal."""
    if device != "cuda":
        return None
    from autotune.machine import gpus

    physical, _, _ = gpus.nvml_gpus()
    return physical[0].gpu.memory_bytes if physical else None


def _oom_space(folder: Path, batch: int = OOM_BATCH) -> Path:
    """cam++'s own space with a batch far too large added and measured first after the baseline (a seed)."""
    from autotune import space, yamlio

    data = space.read(space.space_path("cam++"))  # its `extends` merged in: the whole space, spelled out
    data["params"]["per_device_batch_size"] = {"type": "categorical", "choices": [32, batch]}
    data["baseline"] = {**data["baseline"], "per_device_batch_size": 32, "num_workers": 4}
    # Nothing the OOM does not need: cuDNN's search for each new shape (tens of seconds: benchmarks/gpu_proof.md) and
    # the fbank in the worker, which prepares the whole huge batch alone (the GPU computes it instead).
    data["fixed"] = {**data.get("fixed", {}), "cudnn_benchmark": False}
    huge = {"per_device_batch_size": batch, "num_workers": 4, "prefetch_factor": 1, "precision": "fp32"}
    huge["feature_device"] = "device"
    for section in ("cuda", "cpu"):
        data[section] = {"seeds": [huge]}
    return yamlio.atomic_write_text(folder / "oom_space.yaml", yamlio.dump_yaml(data))


def study_verdict(results_dir: Path, oom_batch: int) -> tuple[bool, bool, list[str]]:
    """Read the run's study from its storage, as anyone could: (every trial of `oom_batch` is an 'oom' told to
    Optuna as infeasible, another trial was measured, one line per trial)."""
    from autotune.search.in_flight import FEASIBILITY
    from autotune.storage import open_storage, sqlite_url

    storage = open_storage(sqlite_url((results_dir / "studies.db").resolve()))
    trials = [trial for study in storage.get_all_studies() for trial in storage.get_all_trials(study._study_id)]
    statuses = []  # (batch, status, the feasibility constraint told to Optuna)
    for trial in trials:
        config, result = trial.user_attrs.get("config") or {}, trial.user_attrs.get("result") or {}
        constraint = (trial.constraints or {}).get(FEASIBILITY)
        statuses.append((config.get("per_device_batch_size"), result.get("status"), constraint))
    huge = [entry for entry in statuses if entry[0] == oom_batch]
    classified = bool(huge) and all(status == "oom" and (constraint or 0) > 0 for _, status, constraint in huge)
    measured = any(status == "ok" for batch, status, _ in statuses if batch != oom_batch)
    lines = [f"bs={batch}: {status} (infeasible={constraint})" for batch, status, constraint in statuses]
    return classified, measured, lines


def result_figures(result: Path) -> dict[str, Any]:
    """The figures benchmarks/README.md reports from a result YAML: baseline vs winner, speedup, peak share, winner."""
    import yaml

    written = yaml.safe_load(result.read_text())
    metrics = written["metrics"]
    winner, baseline, compute = metrics["winner"], metrics.get("baseline") or {}, metrics.get("compute") or {}
    return {
        "winner_samples_per_second": winner.get("samples_per_second"),
        "winner_spread_fraction": winner.get("spread_fraction"),
        "baseline_samples_per_second": baseline.get("samples_per_second"),
        "speedup": metrics.get("speedup"),
        "fraction_of_peak": compute.get("fraction_of_peak"),
        "achieved_tflops": compute.get("achieved_tflops"),
        "pipeline_efficiency": compute.get("pipeline_efficiency"),
        "gpu_utilization_percent": winner.get("gpu_utilization_percent"),
        "winner_dataloader": written["dataloader"],
        "winner_precision": written["precision"]["name"],
    }


@step(
    "full_run",
    "`autotune run --model cam++ --budget 5m --devices 1`, its YAML and its exports",
    budget_s=420,
    min_s=150,
)
def full_run(context: StepContext) -> Proven:
    run_timeout_s = context.budget_s - STOP_GRACE_S - EXPORTS_S
    budget = max(60, min(300, int(run_timeout_s - RUN_OVERHEAD_S)))
    result = context.workdir / RESULT_NAME
    args = ["run", "--model", "cam++", "--budget", f"{budget}s", "--devices", "1", "--device", context.device]
    args += ["--results-dir", str(context.workdir), "--out", str(result)]
    started = time.perf_counter()
    done = autotune_command(*args, cwd=context.workdir, timeout_s=run_timeout_s)
    numbers: dict[str, Any] = {
        "budget_s": budget,
        "exit_code": done.returncode,
        "wall_s": time.perf_counter() - started,
    }
    if done.returncode != 0:
        numbers["output"] = _tail(done.stdout)
    if not result.exists():
        return Proven(passed=False, numbers=numbers, notes=["the run wrote no result"])
    numbers.update(result_figures(result))
    exports = {}
    for target in EXPORT_TARGETS:
        snippet = autotune_command("export", str(result), "--to", target, cwd=context.workdir, timeout_s=60)
        exports[target] = snippet.returncode == 0 and bool(snippet.stdout.strip())
    numbers["exports"] = exports
    return Proven(
        passed=done.returncode == 0 and all(exports.values()) and bool(numbers["winner_samples_per_second"]),
        numbers=numbers,
        notes=[
            f"--budget {budget}s (5 min, less when the proof's time limit leaves less); the run must exit 0 within "
            f"--budget + {RUN_OVERHEAD_S} s (past it, SIGTERM: it writes its best so far and exits 130, which fails "
            f"this step but leaves the YAML for the next); exports to {', '.join(EXPORT_TARGETS)} must exit 0 with a "
            "snippet",
        ],
    )


def _plain_training(result: Path, device: str, window_s: float, *, read_loss: bool) -> dict[str, Any]:
    """What a user writes with the result: load_config, DataLoader(**cfg.dataloader_kwargs()), the backend flags,
    autocast and GradScaler around an ordinary CAM++ loop; samples/s over a timed window after warm-up.

    read_loss: read the loss every step, as the recipe's own loop does for its meters (3D-Speaker's
    speakerlab/bin/train.py, `train_stats.update('Loss', loss.item(), ...)`). Without it nothing waits for the GPU,
    and at a new epoch's start the CPU is still steps ahead: the new workers start while queued steps run."""
    import torch

    import autotune
    from autotune.data import SpeakerCropDataset, collate_speaker_batch, default_source, load_source
    from autotune.gpu_proof.campplus import build_campplus, campplus_loss

    cfg = autotune.load_config(result)
    options = dict(cfg.workload.get("options") or {})
    if cfg.data.get("synthetic"):
        source = default_source()
    else:
        path = cfg.data["path"]
        assert path is not None  # DataSource.describe() wrote it: a source always has its path (a str)
        source = load_source(path, max_utterances=None)
    dataset = SpeakerCropDataset(source.utterances, source.speakers, crop_s=float(options.get("crop_s", 3.0)))
    loader = torch.utils.data.DataLoader(
        dataset, shuffle=True, collate_fn=collate_speaker_batch, **cfg.dataloader_kwargs()
    )
    cfg.apply_backend_flags()
    model, optimizer = build_campplus(device, len(source.speakers), options)
    scaler = cfg.grad_scaler()
    samples, steps, epochs, started = 0, 0, 0, None
    warmup_until = time.perf_counter() + window_s / 2
    while True:
        epochs += 1
        for features, labels in loader:
            features = features.to(device, non_blocking=cfg.config.pin_memory)
            labels = labels.to(device, non_blocking=cfg.config.pin_memory)
            optimizer.zero_grad(set_to_none=True)
            with cfg.autocast():
                loss = campplus_loss(model, features, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if read_loss:
                loss.item()
            steps += 1
            if started is None and time.perf_counter() > warmup_until and steps >= 3:
                synchronize(device)
                started, samples = time.perf_counter(), 0
            elif started is not None:
                samples += int(labels.shape[0])
                if time.perf_counter() - started > window_s:
                    synchronize(device)
                    rate = samples / (time.perf_counter() - started)
                    return {"samples_per_second": rate, "steps": steps, "epochs": epochs}


def predicted_loop_rate(tuned: dict[str, Any]) -> tuple[float, str]:
    """What the result says a plain loop over its own data reaches, and why. Where the run charged each epoch's start
    (the user's data), that is the winner's samples_per_second; on the synthetic stand-in it was measured but not
    charged (trial/run_length.py), and a loop over the stand-in pays it every epoch: the winner's steady rate with
    epoch_start_s added to each epoch of the result's own accounting."""
    winner = tuned["metrics"]["winner"]
    if (tuned["metrics"].get("run_length") or {}).get("per_epoch_costs", True):
        return float(winner["samples_per_second"]), "the winner's samples_per_second (each epoch's start charged)"
    steady = float(winner.get("steady_samples_per_second") or winner["samples_per_second"])
    wait = float(winner.get("epoch_start_s") or 0.0)
    epoch = int((winner.get("epoch_accounting") or {}).get("samples_per_epoch") or 0)
    if not epoch or not wait:
        return steady, "the winner's steady rate (no epoch start measured)"
    rate = epoch / (epoch / steady + wait)
    return rate, f"the winner's steady {steady:,.1f} samples/s with its {wait:.2f}-s epoch start each {epoch} samples"


@step(
    "load_config_loop",
    "the full run's YAML through load_config in a plain loop trains at the winner's speed",
    budget_s=120,
    min_s=45,
)
def load_config_loop(context: StepContext) -> Proven:
    import yaml

    began = time.perf_counter()
    result = context.kit_dir / "full_run" / RESULT_NAME
    if not result.exists():
        return Proven(passed=False, notes=[f"no {RESULT_NAME} from full_run to load"])
    # Two loops, each half a window of warm-up and a window: the recipe's (the loss read every step), judged, then
    # one that never reads it, reported (the time left decides)
    window_s = max(10.0, min(20.0, (context.budget_s - 40) / 3))
    measured = _plain_training(result, context.device, window_s, read_loss=True)
    tuned = yaml.safe_load(result.read_text())
    winner = tuned["metrics"]["winner"]
    predicted, basis = predicted_loop_rate(tuned)
    ratio = measured["samples_per_second"] / predicted
    tolerance = max(0.10, float(winner.get("spread_fraction") or 0.0))
    numbers = {
        "plain_loop_samples_per_second": measured["samples_per_second"],
        "plain_loop_steps": measured["steps"],
        "plain_loop_epochs": measured["epochs"],
        "predicted_samples_per_second": predicted,
        "winner_samples_per_second": winner["samples_per_second"],
        "winner_min_max": [winner.get("samples_per_second_min"), winner.get("samples_per_second_max")],
        "ratio": ratio,
        "tolerance": tolerance,
        "window_s": window_s,
    }
    if context.budget_s - (time.perf_counter() - began) > 1.5 * window_s + 15:  # its warm-up, window and set-up
        unread = _plain_training(result, context.device, window_s, read_loss=False)
        numbers["loop_without_loss_read_samples_per_second"] = unread["samples_per_second"]
        numbers["loop_without_loss_read_ratio"] = unread["samples_per_second"] / predicted
    return Proven(
        passed=abs(ratio - 1) <= tolerance,
        numbers=numbers,
        notes=[
            f"predicted: {basis}; within noise: |plain / predicted - 1| at most the larger of 10% and the winner's "
            "own spread across its measurements. The loop reads its loss every step as the recipe's does (judged); "
            "one that never reads it lets the CPU run steps ahead into a new epoch (reported, not judged)",
        ],
    )


# At least 60 s (estimated, not yet run on a GPU): without cuDNN's search the baseline is ~25 s (start, set-up, a 12-s
# window), the huge trial ~15 s to its OOM (2,048 decodes and crops), the run's own checks ~10 s. More would leave it
# unrun after the full run in a 600-s proof (the step times of benchmarks/results/gpu_proof-h200-2026-11-28d.md).
@step("oom_study", "a batch far too large is an 'oom' trial, and the study goes on to a winner", budget_s=180, min_s=60)
def oom_study(context: StepContext) -> Proven:
    run_timeout_s = context.budget_s - STOP_GRACE_S
    # Two trials, the baseline and the huge seed, and a --budget the step's own time limit bounds: with the step's
    # time as --budget, the seed's estimate (64 times the baseline's batch) finds no room after the baseline, and the
    # OOM this step is about never runs (benchmarks/gpu_proof.md#results).
    # Without speed perturbation (a resampling per utterance): the step is about the OOM, not the recipe's pipeline;
    # with it and cuDNN's search the huge trial takes minutes to reach its OOM (benchmarks/gpu_proof.md#results).
    batch = oom_batch(_device_memory_bytes(context.device))
    args = ["run", "--model", "cam++", "--space", str(_oom_space(context.workdir, batch)), "--trials", "2"]
    args += ["--budget", "30m", "--no-amp-check", "--no-ceiling", "--confirm", "0", "--window", "3"]
    args += ["--option", "speed_perturb=false"]
    args += ["--device", context.device, "--devices", "1", "--results-dir", str(context.workdir)]
    args += ["--out", str(context.workdir / "oom.yaml")]
    done = autotune_command(*args, cwd=context.workdir, timeout_s=run_timeout_s)
    classified, measured, trials = study_verdict(context.workdir, batch)
    numbers: dict[str, Any] = {"exit_code": done.returncode, "trials": trials, "oom_batch": batch}
    if done.returncode != 0:
        numbers["output"] = _tail(done.stdout)
    return Proven(
        passed=done.returncode == 0 and classified and measured and (context.workdir / "oom.yaml").exists(),
        numbers=numbers,
        notes=[
            f"`autotune run` on cam++'s space with bs={batch} (sized to the device) added as a seed: that trial must "
            "be told to Optuna as status oom with a positive constraint, the other trials measured, and the run exit 0 "
            "with a YAML",
        ],
    )
