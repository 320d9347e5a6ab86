"""`autotune doctor` as a user runs it: in-process with typer's CliRunner, and as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.gpu_proof.registry import STEPS
from tests.fixtures.fake_nvml import H100, nvmlClocksEventReasonHwSlowdown

ROOT = Path(__file__).resolve().parents[2]


def test_json_findings_and_exit_zero_on_this_machine() -> None:
    result = CliRunner().invoke(app, ["doctor", "--model", "cam++", "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    names = [finding["name"] for finding in report["findings"]]
    assert names[:3] == ["torch.build", "driver", "cuda.visible_devices"]
    assert {"loader.shm", "data.read", "audio.decoders"} <= set(names)
    assert report["exit_code"] == 0 and report["counts"]["fail"] == 0
    import torch

    assert not torch.cuda.is_initialized()  # the doctor can run beside a training job


def test_a_failing_check_exits_one(install_nvml) -> None:
    install_nvml([replace(H100, clock_reasons=nvmlClocksEventReasonHwSlowdown)])
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    failed = [f for f in json.loads(result.stdout)["findings"] if f["verdict"] == "fail"]
    assert [f["name"] for f in failed] == ["gpu0.clocks"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--data", "/no/such/list.csv"], "--data /no/such/list.csv does not exist"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--model", "cam++", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--workers", "-1"], "--workers must be at least 0"),
        (["--result", "/no/such/result.yaml"], "/no/such/result.yaml"),
    ],
    ids=["missing-data", "unknown-model", "zero-batch", "negative-workers", "missing-result"],
)
def test_bad_input_is_one_line_and_exit_two(args, words) -> None:
    result = CliRunner().invoke(app, ["doctor", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0]
    assert result.stdout == ""


def _autotune(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )


@pytest.mark.slow
def test_doctor_runs_as_a_real_process_on_this_machine() -> None:
    done = _autotune("doctor", "--model", "cam++")
    assert done.returncode == 0, done.stderr
    assert "loader.shm" in done.stdout and "nothing fails (exit 0)" in done.stdout


def test_gpu_proof_on_a_cpu_machine_proves_nothing_and_exits_one(tmp_path) -> None:
    out = tmp_path / "gpu_proof.md"
    result = CliRunner().invoke(app, ["doctor", "--gpu-proof", "--out", str(out)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA device: nothing proven (")
    assert not out.exists()


def test_gpu_proof_steps_name_a_subset_and_an_unknown_one_is_bad_input(tmp_path) -> None:
    out = tmp_path / "gpu_proof.md"
    result = CliRunner().invoke(app, ["doctor", "--gpu-proof", "--out", str(out), "--proof-steps", "full_run,nope"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: unknown proof step 'nope'; the steps are " + ", ".join(STEPS)]
    assert not out.exists()
    chosen = CliRunner().invoke(app, ["doctor", "--gpu-proof", "--out", str(out), "--proof-steps", "tf32, amp"])
    assert chosen.exit_code == 1 and "no CUDA device: nothing proven" in chosen.stderr  # known: on to the device


@pytest.mark.slow
def test_gpu_proof_as_a_real_process_on_this_cpu_machine(tmp_path) -> None:
    done = _autotune("doctor", "--gpu-proof", "--out", str(tmp_path / "gpu_proof.md"))
    assert done.returncode == 1
    assert "no CUDA device: nothing proven" in done.stderr
