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

__all__ = ["OOM_BATCH", "RESULT_NAME", "autotune_command", "result_figures", "study_verdict"]

OOM_BATCH = 2048  # CAM++ saves ~136 MB of activations per 3 s sample in fp32: ~280 GB, past any single GPU
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


def _oom_space(folder: Path) -> Path:
    """cam++'s own space with a batch far too large added and measured first after the baseline (a seed)."""
    from autotune import space, yamlio

    data = space.read(space.space_path("cam++"))  # its `extends` merged in: the whole space, spelled out
    data["params"]["per_device_batch_size"] = {"type": "categorical", "choices": [32, OOM_BATCH]}
    data["baseline"] = {**data["baseline"], "per_device_batch_size": 32, "num_workers": 4}
    # Nothing the OOM does not need: cuDNN's search for each new shape (tens of seconds: benchmarks/gpu_proof.md) and
    # the fbank in the worker, which prepares the whole 2,048-utterance batch alone (the GPU computes it instead).
    data["fixed"] = {**data.get("fixed", {}), "cudnn_benchmark": False}
    huge = {"per_device_batch_size": OOM_BATCH, "num_workers": 4, "prefetch_factor": 1, "precision": "fp32"}
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


def _plain_training(result: Path, device: str, window_s: float) -> dict[str, Any]:
    """What a user writes with the result: load_config, DataLoader(**cfg.dataloader_kwargs()), the backend flags,
    autocast and GradScaler around an ordinary CAM++ loop; samples/s over a timed window after warm-up."""
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
    samples, steps, started = 0, 0, None
    warmup_until = time.perf_counter() + window_s / 2
    while True:
        for features, labels in loader:
            features = features.to(device, non_blocking=cfg.config.pin_memory)
            labels = labels.to(device, non_blocking=cfg.config.pin_memory)
            optimizer.zero_grad(set_to_none=True)
            with cfg.autocast():
                loss = campplus_loss(model, features, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            steps += 1
            if started is None and time.perf_counter() > warmup_until and steps >= 3:
                synchronize(device)
                started, samples = time.perf_counter(), 0
            elif started is not None:
                samples += int(labels.shape[0])
                if time.perf_counter() - started > window_s:
                    synchronize(device)
                    return {"samples_per_second": samples / (time.perf_counter() - started), "steps": steps}


@step(
    "load_config_loop",
    "the full run's YAML through load_config in a plain loop trains at the winner's speed",
    budget_s=120,
    min_s=45,
)
def load_config_loop(context: StepContext) -> Proven:
    import yaml

    result = context.kit_dir / "full_run" / RESULT_NAME
    if not result.exists():
        return Proven(passed=False, notes=[f"no {RESULT_NAME} from full_run to load"])
    window_s = max(10.0, min(30.0, (context.budget_s - 30) / 2))
    measured = _plain_training(result, context.device, window_s)
    winner = yaml.safe_load(result.read_text())["metrics"]["winner"]
    ratio = measured["samples_per_second"] / winner["samples_per_second"]
    tolerance = max(0.10, float(winner.get("spread_fraction") or 0.0))
    numbers = {
        "plain_loop_samples_per_second": measured["samples_per_second"],
        "plain_loop_steps": measured["steps"],
        "winner_samples_per_second": winner["samples_per_second"],
        "winner_min_max": [winner.get("samples_per_second_min"), winner.get("samples_per_second_max")],
        "ratio": ratio,
        "tolerance": tolerance,
        "window_s": window_s,
    }
    return Proven(
        passed=abs(ratio - 1) <= tolerance,
        numbers=numbers,
        notes=[
            "within noise: |plain / winner - 1| at most the larger of 10% and the winner's own spread across its "
            "measurements; the winner's figure amortises DataLoader restarts over an epoch, and so does this loop, "
            "which runs across epoch boundaries as training does",
        ],
    )


# At least 60 s (estimated, not yet run on a GPU): without cuDNN's search the baseline is ~25 s (start, set-up, a 12-s
# window), the huge trial ~15 s to its OOM (2,048 decodes and crops), the run's own checks ~10 s. More would leave it
# unrun after the full run in a 600-s proof (the step times of benchmarks/results/gpu_proof-h200-s17.md).
@step("oom_study", "a batch far too large is an 'oom' trial, and the study goes on to a winner", budget_s=180, min_s=60)
def oom_study(context: StepContext) -> Proven:
    run_timeout_s = context.budget_s - STOP_GRACE_S
    # Two trials, the baseline and the huge seed, and a --budget the step's own time limit bounds: with the step's
    # time as --budget, the seed's estimate (64 times the baseline's batch) finds no room after the baseline, and the
    # OOM this step is about never runs (benchmarks/gpu_proof.md#results).
    # Without speed perturbation (a resampling per utterance): the step is about the OOM, not the recipe's pipeline;
    # with it and cuDNN's search the huge trial takes minutes to reach its OOM (benchmarks/gpu_proof.md#results).
    args = ["run", "--model", "cam++", "--space", str(_oom_space(context.workdir)), "--trials", "2"]
    args += ["--budget", "30m", "--no-amp-check", "--no-ceiling", "--confirm", "0", "--window", "3"]
    args += ["--option", "speed_perturb=false"]
    args += ["--device", context.device, "--devices", "1", "--results-dir", str(context.workdir)]
    args += ["--out", str(context.workdir / "oom.yaml")]
    done = autotune_command(*args, cwd=context.workdir, timeout_s=run_timeout_s)
    classified, measured, trials = study_verdict(context.workdir, OOM_BATCH)
    numbers: dict[str, Any] = {"exit_code": done.returncode, "trials": trials, "oom_batch": OOM_BATCH}
    if done.returncode != 0:
        numbers["output"] = _tail(done.stdout)
    return Proven(
        passed=done.returncode == 0 and classified and measured and (context.workdir / "oom.yaml").exists(),
        numbers=numbers,
        notes=[
            f"`autotune run` on cam++'s space with bs={OOM_BATCH} added as a seed: that trial must be told to Optuna "
            "as status oom with a positive constraint, the other trials measured, and the run exit 0 with a YAML",
        ],
    )
