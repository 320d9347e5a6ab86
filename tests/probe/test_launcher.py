"""Own training measured for real: the example training script run as a trial under the probe, in a subprocess, with
its own argparse, config file, DataLoader and loop. What the probe saw is checked against what the script did."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import FAST_TIMING, spec_for

pytestmark = pytest.mark.slow
PYTHON = sys.executable
TEMPLATE = (
    f"{PYTHON} train.py --config {{config}} --num-workers {{num_workers}} --pin-memory {{pin_memory}} "
    "--checkpoint model.pt"
)


def _launcher(project: Path, template: str = TEMPLATE, **kwargs: object) -> CommandLauncher:
    command = TrainingCommand.checked(
        template,
        config_path=str(project / "train.yaml"),
        sets=["train.batch_size={per_device_batch_size}"],
        cwd=str(project),
        **kwargs,  # type: ignore[arg-type]
    )
    return CommandLauncher(command=command)


def _loader_line(project: Path) -> int:
    """The line of train.py that builds its DataLoader."""
    lines = (project / "train.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if "torch.utils.data.DataLoader(" in line)


def _no_process_left(project: Path) -> bool:
    """No process runs the training any more (its workers included)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                runs_training = b"train.py" in (entry / "cmdline").read_bytes()
                if runs_training and (entry / "cwd").resolve() == project.resolve():
                    return False
            except OSError:
                continue
    return True


def test_the_training_is_measured_its_values_in_force_and_ended_cleanly(tmp_path: Path, training: Path) -> None:
    spec = spec_for(tmp_path, per_device_batch_size=24, num_workers=1, prefetch_factor=2, pin_memory=False)
    result = _launcher(training)(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.reason + result.log_tail
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.window_steps >= 2 and result.window_s and result.window_s >= 1.0
    assert result.all_losses_finite is True
    assert result.observed is not None and result.observed["per_device_batch_size"] == 24
    assert result.in_force is not None
    assert {name: entry["in_force"] for name, entry in result.in_force.items()} == {
        "per_device_batch_size": True,
        "num_workers": True,
        "pin_memory": True,
    }
    assert result.in_force["per_device_batch_size"]["by"] == "config"
    accounting = result.epoch_accounting
    assert accounting is not None and accounting["dataset_size"] == 96 and accounting["samples_per_epoch"] == 96
    assert accounting["built_at"] == f"train.py:{_loader_line(training)}"
    assert (training / "train.yaml").read_text().count("batch_size: 16") == 1  # the user's file untouched
    assert _no_process_left(training)
    checkpoint = training / "model.pt"  # ended at a step boundary: any checkpoint the script saved is whole
    if checkpoint.exists():
        torch.load(checkpoint, weights_only=True)


def test_a_value_the_training_ignores_is_reported_not_in_force(tmp_path: Path, training: Path) -> None:
    spec = spec_for(tmp_path, num_workers=2, prefetch_factor=2)
    result = _launcher(training, TEMPLATE + " --ignore-workers")(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.reason
    verdict = result.in_force["num_workers"]  # type: ignore[index]
    assert verdict["in_force"] is False and verdict["ran"] == 0 and verdict["asked"] == 2
    assert verdict["note"].startswith("num_workers: your training ran with 0, not 2: the value does not reach its ")
    assert f"train.py:{_loader_line(training)} builds the DataLoader" in verdict["note"]


def test_the_probe_applies_a_dataloader_knob_the_training_does_not_carry(tmp_path: Path, training: Path) -> None:
    template = f"{PYTHON} train.py --config {{config}} --ignore-workers"
    spec = spec_for(tmp_path, num_workers=1, prefetch_factor=3, persistent_workers=True)
    launcher = _launcher(training, template, apply=["num_workers", "prefetch_factor", "persistent_workers"])
    result = launcher(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.reason + result.log_tail
    assert result.observed["num_workers"] == 1 and result.observed["prefetch_factor"] == 3  # type: ignore[index]
    verdict = result.in_force["num_workers"]  # type: ignore[index]
    assert verdict["in_force"] is True and verdict["by"] == "autotune" and "applied by autotune" in verdict["note"]


def test_a_command_that_never_steps_is_told_so(tmp_path: Path, training: Path) -> None:
    command = TrainingCommand.checked(f"{PYTHON} -c 'import torch, time; time.sleep(60)'", cwd=str(training))
    result = CommandLauncher(command=command, first_step_timeout_s=4)(
        spec_for(tmp_path), workdir=tmp_path / "trial", timeout_s=60
    )
    assert result.status == "error"
    assert result.reason.startswith("no optimizer step in 4 s: is this a training command?")
    assert result.wall_s is not None and result.wall_s < 30


def test_a_command_that_fails_at_import_names_the_error(tmp_path: Path, training: Path) -> None:
    command = TrainingCommand.checked(f"{PYTHON} -c 'import torch, no_such_module_here'", cwd=str(training))
    result = CommandLauncher(command=command)(spec_for(tmp_path), workdir=tmp_path / "trial", timeout_s=60)
    assert result.status == "error"
    assert result.reason == (
        "the training failed after 0 optimizer steps: ModuleNotFoundError: No module named 'no_such_module_here'"
    )


def test_a_program_that_does_not_exist_is_one_line(tmp_path: Path, training: Path) -> None:
    command = TrainingCommand.checked("no-such-program-anywhere train.py", cwd=str(training))
    result = CommandLauncher(command=command)(spec_for(tmp_path), workdir=tmp_path / "trial", timeout_s=60)
    assert result.status == "error" and "could not start" in result.reason


def test_a_training_too_short_for_its_window_says_so(tmp_path: Path, training: Path) -> None:
    text = re.sub(r"epochs: \d+", "epochs: 1", (training / "train.yaml").read_text())
    (training / "train.yaml").write_text(text)
    timing = dataclasses.replace(FAST_TIMING, min_window_steps=50)  # more steps than one epoch (six) holds
    spec = spec_for(tmp_path, timing, num_workers=0)
    result = _launcher(training)(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "error"
    assert result.reason.startswith("the training ended after 6 optimizer steps, before its window was measured")


def test_a_batch_larger_than_the_data_is_named_not_taken_for_a_command_that_does_not_train(
    tmp_path: Path, training: Path
) -> None:
    """The example's DataLoader drops its last partial batch: at a batch larger than the data an epoch is empty and
    the training ends without a step, which the result says, with the loader's line and the sizes."""
    spec = spec_for(tmp_path, per_device_batch_size=5000, num_workers=0)
    result = _launcher(training)(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "error"
    assert re.fullmatch(
        rf"the training's DataLoader \(built at train\.py:{_loader_line(training)}\) has no batch to give: \d+ samples "
        r"at batch 5000 per process; give it a batch no larger than the samples each process gets, or more data",
        result.reason,
    ), result.reason


def test_a_loss_that_is_not_finite_is_caught(tmp_path: Path, training: Path) -> None:
    script = (
        (training / "train.py")
        .read_text()
        .replace(
            "loss = torch.nn.functional.cross_entropy(", "loss = float('nan') * torch.nn.functional.cross_entropy("
        )
    )
    (training / "train.py").write_text(script)
    result = _launcher(training)(spec_for(tmp_path, num_workers=0), workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "nonfinite" and result.all_losses_finite is False


def test_a_sitecustomize_the_probe_shadows_still_runs(tmp_path: Path, training: Path) -> None:
    own = tmp_path / "own_site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    template = f"{PYTHON} -c 'import os, sys; sys.exit(0 if os.environ.get(\"USER_SITE_RAN\") else 3)'"
    command = TrainingCommand.checked(template, cwd=str(training))
    launcher = CommandLauncher(command=command, environment={"PYTHONPATH": str(own)})
    result = launcher(spec_for(tmp_path), workdir=tmp_path / "trial", timeout_s=60)
    assert "exited with code 3" not in result.reason
    assert "without an optimizer step" in result.reason
    assert os.environ.get("USER_SITE_RAN") is None


def test_a_training_dies_with_a_run_that_is_killed_outright(tmp_path: Path, training: Path) -> None:
    """The run is SIGKILLed mid-trial (nothing of it can clean up): the kernel takes the training down with it."""
    pid_file = tmp_path / "training.pid"
    script = f"import os, time; open({json.dumps(str(pid_file))}, 'w').write(str(os.getpid())); time.sleep(120)"
    command = f"{PYTHON} -c {shlex.quote(script)}"
    run = (
        "import sys\nfrom pathlib import Path\nfrom autotune.probe.command import TrainingCommand\n"
        "from autotune.probe.launcher import CommandLauncher\nfrom tests.probe.conftest import spec_for\n"
        f"command = TrainingCommand.checked({command!r}, cwd={str(training)!r})\n"
        f"CommandLauncher(command=command, first_step_timeout_s=300)(spec_for(Path({str(tmp_path)!r})), "
        f"workdir=Path({str(tmp_path / 'trial')!r}), timeout_s=300)\n"
    )
    parent = subprocess.Popen([PYTHON, "-c", run], cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the training never started"
            time.sleep(0.1)
        training_pid = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while (
            Path(f"/proc/{training_pid}").exists()
            and (Path(f"/proc/{training_pid}") / "stat").read_text().split()[2] != "Z"
        ):
            assert time.monotonic() < deadline, "the training outlived the killed run"
            time.sleep(0.1)
    finally:
        parent.kill()


def test_a_hopeless_trial_is_pruned_from_the_progress_the_probe_writes(tmp_path: Path, training: Path) -> None:
    """The parent's pruner reads rank 0's running rate as it reads a built-in trial's, and stops the training."""
    seen: list[dict] = []

    def hopeless(progress: dict) -> str | None:
        seen.append(progress)
        return "pruned: too slow" if progress.get("phase") == "window" else None

    spec = spec_for(tmp_path, timing=dataclasses.replace(FAST_TIMING, window_s=30.0), num_workers=0)
    result = _launcher(training)(spec, workdir=tmp_path / "trial", timeout_s=120, should_prune=hopeless)
    assert result.status == "pruned" and result.reason == "pruned: too slow"
    assert {"phase", "samples_per_second", "elapsed_s"} <= set(seen[-1]) and seen[-1]["samples_per_second"] > 0
    assert result.wall_s is not None and result.wall_s < 60  # stopped, not run to its 30-s window's end
    assert _no_process_left(training)


VALIDATING = """
import sys, torch
batch = int(sys.argv[1])
train = torch.utils.data.DataLoader(torch.randn(4000, 8), batch_size=batch, shuffle=True)
dev = torch.utils.data.DataLoader(torch.randn(2000, 8), batch_size=500)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(1000):
    for step, x in enumerate(train):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 3 == 2:  # a validation pass inside the epoch, as WeNet's cv_data or Lightning's val_check_interval
            with torch.no_grad():
                for y in dev:
                    model(y)
"""


def test_a_validation_loaders_batches_are_not_counted_as_training_samples(tmp_path: Path) -> None:
    """A training that validates inside its window: its dev loader yields four batches of 500 items every three
    steps of 8. Only the loader optimizer steps follow is counted: 8 samples a step, not 8 + 2000/3."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(VALIDATING)
    command = TrainingCommand.checked(f"{PYTHON} train.py {{per_device_batch_size}}", cwd=str(project))
    spec = spec_for(tmp_path, per_device_batch_size=8)
    result = CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.reason + result.log_tail
    assert result.window_steps >= 3 and result.samples_per_second and result.window_s
    per_step = result.samples_per_second * result.window_s / result.window_steps
    assert per_step == pytest.approx(8, rel=0.01)
    assert result.observed is not None and result.observed["per_device_batch_size"] == 8
