"""Running the proof: on this CPU machine it proves nothing and says so; each step runs in its own process, within
the time limit, and a failing or hanging step does not stop the rest."""

from __future__ import annotations

import pytest

from autotune.errors import UserError
from autotune.gpu_proof import STEPS, ProofSettings, run_proof
from autotune.gpu_proof import runner as proof_runner
from autotune.gpu_proof.registry import Step

# Every GPU-only path the proof must exercise (benchmarks/gpu_proof.md), in the order it runs (quick checks first,
# the long run last).
EXPECTED_STEPS = [
    "tf32",
    "amp",
    "cudnn_benchmark",
    "telemetry",
    "peak_memory",
    "nccl",
    "full_run",
    "load_config_loop",
    "oom_study",
]


def test_the_steps_are_what_the_issue_asks_in_order() -> None:
    assert list(STEPS) == EXPECTED_STEPS
    assert all(step.min_s <= step.budget_s for step in STEPS.values())


def test_the_steps_fit_the_ten_minutes_at_their_least() -> None:
    assert sum(step.min_s for step in STEPS.values()) < proof_runner.DEFAULT_TIME_LIMIT_S


def test_on_a_machine_without_cuda_nothing_is_proven_nor_written(tmp_path) -> None:
    out = tmp_path / "gpu_proof.md"
    report = run_proof(ProofSettings(out=out))
    assert report.nothing_proven and report.exit_code == 1 and not report.steps
    assert report.verdict_line().startswith("no CUDA device: nothing proven (")
    assert not out.exists()


def test_unknown_steps_and_bad_limits_are_user_errors(tmp_path) -> None:
    with pytest.raises(UserError, match="unknown proof step 'nope'; the steps are tf32, amp"):
        run_proof(ProofSettings(out=tmp_path / "x.md", steps=("nope",)))
    with pytest.raises(UserError, match="time limit must be positive"):
        run_proof(ProofSettings(out=tmp_path / "x.md", time_limit_s=0))


def _step(name: str, budget_s: float, min_s: float) -> Step:
    return Step(name, name, lambda context: None, budget_s, min_s)  # type: ignore[arg-type,return-value]


def test_a_steps_budget_keeps_the_least_the_later_steps_need() -> None:
    later = [_step("b", 100, 40), _step("c", 100, 30)]
    assert proof_runner._budget(_step("a", 400, 10), 300, later) == 230
    assert proof_runner._budget(_step("a", 50, 10), 300, later) == 50


def test_a_step_without_time_left_is_not_run_and_the_report_says_so(tmp_path, monkeypatch) -> None:
    report = run_proof(ProofSettings(out=tmp_path / "r.md", steps=("full_run",), time_limit_s=10, rehearse_on_cpu=True))
    (step,) = report.steps
    assert step.passed is None and step.error.startswith("not run: 10 s left for it, needs 150")
    assert "| full_run | not run |" in (tmp_path / "r.md").read_text()


def test_a_step_past_its_budget_is_killed_with_its_process_group(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(proof_runner, "KILL_GRACE_S", 0.0)
    context = proof_runner.StepContext(device="cpu", workdir=tmp_path / "amp", kit_dir=tmp_path, budget_s=1.0)
    result = proof_runner._run_step(STEPS["amp"], context)
    assert result.passed is False
    assert result.error.startswith("killed after 1 s")
    assert result.seconds < 30


@pytest.mark.slow
def test_a_rehearsal_runs_each_step_in_its_own_process_and_a_failure_does_not_stop_the_rest(tmp_path) -> None:
    """On a CPU, tf32 fails (TF32 changes nothing there) and nccl passes (gloo): both are recorded, in order."""
    out = tmp_path / "rehearsal.md"
    report = run_proof(ProofSettings(out=out, steps=("tf32", "nccl"), workdir=tmp_path / "kit", rehearse_on_cpu=True))
    tf32, nccl = report.steps
    assert tf32.passed is False and tf32.numbers["matmul_ieee_relative_error"] < 1e-5
    assert tf32.numbers["flags_tf32"]["legacy_matmul_allow_tf32"] is True  # autotune's flags were applied
    assert nccl.passed is True and nccl.numbers["backend"] == "gloo" and nccl.numbers["all_reduce_correct"]
    assert (tmp_path / "kit" / "nccl" / "step.log").exists()
    assert "CPU rehearsal" in out.read_text()


@pytest.mark.slow
def test_the_cudnn_step_measures_each_setting_in_a_fresh_process(tmp_path) -> None:
    """In one process the benchmark pass met shapes the heuristic pass had already chosen for, and searched nothing
    (an H200: 0.19 s against a trial's 23-31 s first step, gpu_proof-h200.md); each setting now starts fresh."""
    report = run_proof(ProofSettings(out=tmp_path / "r.md", steps=("cudnn_benchmark",), rehearse_on_cpu=True))
    (cudnn,) = report.steps
    assert cudnn.error is None or cudnn.error == "", cudnn.error
    for key in ("first_step_off_s", "step_off_s", "first_step_on_s", "step_on_s"):
        assert cudnn.numbers[key] > 0, key
    assert "fresh process" in " ".join(cudnn.notes)


def _benchmark_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_proof.py"
    spec = importlib.util.spec_from_file_location("benchmark_gpu_proof", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_files_its_report_under_the_gpus_name() -> None:
    script = _benchmark_script()
    assert script.report_path("NVIDIA H100 80GB HBM3").name == "gpu_proof-h100-80gb-hbm3.md"
    assert script.report_path("NVIDIA H200").parent.name == "results"


def test_the_benchmark_on_this_cpu_machine_proves_nothing(capsys) -> None:
    assert _benchmark_script().main([]) == 1
    assert capsys.readouterr().out.startswith("no CUDA device: nothing proven")


def test_the_benchmark_rehearses_its_steps_on_a_cpu_when_asked(capsys, tmp_path) -> None:
    """The lend's prepared script (benchmarks/gpu_lend.sh) is rehearsed through this flag before a GPU is lent."""
    out = tmp_path / "rehearsal.md"
    code = _benchmark_script().main(
        ["--rehearse-on-cpu", "--steps", "tf32", "--out", str(out), "--workdir", str(tmp_path)]
    )
    assert code == 1  # on a CPU, TF32 changes nothing: the step fails, as the runner's own rehearsal test shows
    assert "CPU rehearsal" in out.read_text() and "| tf32 |" in out.read_text()
    assert f"report: {out}" in capsys.readouterr().out


def test_the_benchmark_takes_a_subset_of_steps_and_a_work_folder(capsys, tmp_path) -> None:
    with pytest.raises(UserError, match="unknown proof step 'nope'"):
        _benchmark_script().main(["--steps", "tf32", "nope", "--workdir", str(tmp_path)])
    assert _benchmark_script().main(["--steps", "full_run", "load_config_loop", "--workdir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith("no CUDA device: nothing proven")


def test_a_report_that_cannot_be_written_fails_before_any_step(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot write the report"):
        run_proof(ProofSettings(out=blocker / "sub" / "r.md", steps=("tf32",), rehearse_on_cpu=True))
