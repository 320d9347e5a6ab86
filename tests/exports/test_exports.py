"""Exports: the contract every target keeps, what is shared (precision notes, world size, threads, errors), and which
targets take which workload. Each framework's own behaviour is in test_<target>.py beside this file."""

from __future__ import annotations

import ast
import itertools

import pytest

from autotune.errors import UserError
from autotune.exports import TARGETS, export
from autotune.exports.base import TF32_OFF_ENV, TF32_ON_ENV
from autotune.knobs.precision import PRECISIONS as TRIAL_PRECISIONS
from autotune.result.tuned_config import TunedConfig
from tests.exports.common import MODEL_FOR, NAMES, PRECISIONS, TASKS, bash_words, for_target, make_tuned, notes_text

MATRIX = list(itertools.product(PRECISIONS, (0, 4), (1, 4), (False, True), ("cuda", "cpu")))
MATRIX_IDS = [f"{p}-w{w}-ws{ws}-{'dynamic' if d else 'static'}-{dev}" for p, w, ws, d, dev in MATRIX]


def test_registry_holds_every_target() -> None:
    assert set(TARGETS) == set(NAMES)


def test_exports_know_every_trial_precision() -> None:
    assert PRECISIONS == TRIAL_PRECISIONS  # one home: autotune.knobs.precision


@pytest.mark.parametrize("target", NAMES, ids=NAMES)
@pytest.mark.parametrize(("precision", "workers", "world_size", "dynamic", "device"), MATRIX, ids=MATRIX_IDS)
def test_contract(target: str, precision: str, workers: int, world_size: int, dynamic: bool, device: str) -> None:
    model = "conformer" if dynamic else MODEL_FOR[target][0]
    tuned = make_tuned(
        model=model, precision=precision, workers=workers, world_size=world_size, dynamic=dynamic, device_type=device
    )
    result = export(tuned, target)
    assert result.target == target
    if not result.supported:
        assert "cannot take conformer" in result.notes[0]
        return
    if result.python_text is not None:
        ast.parse(result.python_text)
    if result.command is not None:
        environment, argv = bash_words(result.command)  # valid bash, every word where bash puts it
        assert argv[0] in ("torchrun", "python", "./run.sh", "accelerate")
        assert (TF32_OFF_ENV.split("=")[0] in environment) == (precision == "fp32" and device == "cuda")
    assert result.notes and all(note.strip() and "\n" not in note for note in result.notes)
    assert any(note.startswith(f"Measured: {precision}") for note in result.notes)
    rendered = result.render()
    for part in (result.yaml_text, result.python_text, result.command):
        if part is not None:
            assert part.rstrip() in rendered
    for note in result.notes:
        assert f"# - {note}" in rendered
    assert all(line.startswith("# ") for line in rendered.split("# notes\n")[1].splitlines())


# Which targets take which workload: a target without a recipe for the model says so instead of printing a command.
SUPPORTED = {
    "3d-speaker": {"cam++", "eres2net", "eres2net-large", "ecapa-tdnn", "ecapa-tdnn-512"},
    "wenet": {"conformer"},
    "speechbrain": {"ecapa-tdnn", "ecapa-tdnn-512", "wav2vec2-ctc"},
    "espnet": {"ecapa-tdnn", "ecapa-tdnn-512", "conformer"},
    "lightning": set(TASKS),
    "amphion": {"naturalspeech2"},
    "gpt-sovits": {"gpt-sovits-s1", "gpt-sovits-s2"},
}


@pytest.mark.parametrize("target", NAMES, ids=NAMES)
@pytest.mark.parametrize("model", sorted(TASKS))
def test_targets_say_when_they_cannot_take_a_workload(target: str, model: str) -> None:
    result = export(make_tuned(model=model), target)
    assert result.supported == (model in SUPPORTED[target])
    if not result.supported:
        assert result.command is None and result.yaml_text is None and result.python_text is None
        assert result.notes[0].startswith(f"{target} cannot take {model}: ")
        assert "cannot take this workload" in result.render() and "# command" not in result.render()


@pytest.mark.parametrize("target", NAMES, ids=NAMES)
def test_exports_a_loaded_result(target: str) -> None:
    tuned = for_target(target, precision="bf16", world_size=2, accum=2)
    assert export(TunedConfig.from_yaml(tuned.to_yaml()), target) == export(tuned, target)


# --- which fp32 was measured (issue item 1.1) ----------------------------------------------------------------------


def test_notes_say_which_fp32_was_measured_from_the_trial_record() -> None:
    tuned = make_tuned(precision="fp32-default", fp32_math={"matmul": "ieee", "cudnn_conv": "tf32"})
    tuned = TunedConfig.from_dict(
        tuned.to_dict()
        | {
            "search": {"baseline_config": {"precision": "fp32-default"}},
            "metrics": tuned.metrics
            | {"baseline": {"status": "ok", "fp32_math": {"matmul": "ieee", "cudnn_conv": "tf32"}}},
        }
    )
    measured = export(tuned, "3d-speaker").notes
    note = next(note for note in measured if note.startswith("Measured:"))
    assert "fp32-default (float32 matmuls IEEE, cuDNN convolutions TF32, as recorded by the trial)" in note
    assert "the recipe baseline it is compared with ran fp32-default (float32 matmuls IEEE" in note


@pytest.mark.parametrize(
    ("precision", "words"),
    [
        ("fp32", "strict IEEE float32"),
        ("fp32-default", "the TF32 flags as torch leaves them: matmuls IEEE, cuDNN convolutions TF32"),
        ("tf32", "TF32 in matmuls and cuDNN convolutions"),
        ("bf16", "bfloat16 autocast"),
    ],
)
def test_notes_describe_the_precision_without_a_record(precision: str, words: str) -> None:
    assert f"Measured: {precision} ({words}" in notes_text(export(make_tuned(precision=precision), "lightning"))


def test_a_cpu_result_says_tf32_does_not_apply() -> None:
    notes = notes_text(export(make_tuned(precision="fp32", device_type="cpu"), "3d-speaker"))
    assert "Measured: fp32 on the CPU (TF32 does not apply there)" in notes


@pytest.mark.parametrize("target", ("3d-speaker", "wenet"))
@pytest.mark.parametrize(
    ("precision", "expected"), [("fp32", TF32_OFF_ENV), ("fp32-default", None), ("tf32", TF32_ON_ENV)]
)
def test_frameworks_without_a_tf32_switch_get_it_from_the_environment(
    target: str, precision: str, expected: str | None
) -> None:
    environment, _ = bash_words(export(for_target(target, precision=precision), target).command)
    set_here = {f"{key}={value}" for key, value in environment.items()}
    assert set_here == ({expected} if expected else set())


@pytest.mark.slow  # two fresh interpreters importing torch
def test_tf32_environment_is_what_torch_reads() -> None:
    """TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, as the tf32 commands set it, makes torch report TF32 matmuls; the cuDNN
    convolution default is TF32 already (autotune.knobs.precision.fp32_math reads both)."""
    import subprocess
    import sys

    code = "from autotune.knobs.precision import fp32_math; print(fp32_math())"
    variable, value = TF32_ON_ENV.split("=")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(__import__("pathlib").Path.cwd()), variable: value}
    output = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'matmul': 'tf32'" in output and "'cudnn_conv': 'tf32'" in output
    default = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in env.items() if k != variable},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'matmul': 'ieee'" in default and "'cudnn_conv': 'tf32'" in default  # fp32-default


# --- shared behaviour -------------------------------------------------------------------------------------------


def test_world_size_override_scales_global_batch_and_says_so() -> None:
    result = export(make_tuned(world_size=1), "3d-speaker", world_size=4)
    _, argv = bash_words(result.command)
    assert argv[argv.index("--batch_size") + 1] == "128"
    assert "Measured with world_size=1" in notes_text(result)
    assert not any("Measured with" in note for note in export(make_tuned(world_size=4), "3d-speaker").notes)


def test_world_size_note_under_dynamic_batching_names_the_frame_budget() -> None:
    notes = notes_text(export(make_tuned(model="conformer", dynamic=True), "wenet", world_size=4))
    assert "max_frames_in_batch=12000 per device" in notes and "per_device_batch_size" not in notes


def test_intra_op_threads_reach_the_command() -> None:
    environment, _ = bash_words(export(for_target("wenet", intra_op_threads=3, world_size=2), "wenet").command)
    assert environment["OMP_NUM_THREADS"] == "3"
    assert "torch.set_num_threads(3)" in (export(make_tuned(intra_op_threads=3), "lightning").python_text or "")


def test_unknown_target_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError) as raised:
        export(make_tuned(), "kaldi")
    message = str(raised.value)
    assert "\n" not in message and "'kaldi'" in message
    assert all(name in message for name in NAMES)


def test_bad_world_size_is_a_user_error() -> None:
    with pytest.raises(UserError, match="world-size"):
        export(make_tuned(), "wenet", world_size=0)
