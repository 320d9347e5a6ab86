"""Exports: each target's keys, batch arithmetic, flags and notes against the framework's real configuration."""

from __future__ import annotations

import ast
import itertools
import shlex
from typing import Any

import pytest
import yaml

from autotune.errors import UserError
from autotune.exports import TARGETS, Export, export
from autotune.results import TunedConfig
from autotune.trial.spec import TrialConfig

NAMES = ("3d-speaker", "wenet", "speechbrain", "espnet", "lightning")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def make_tuned(
    *,
    precision: str = "fp32",
    workers: int = 4,
    world_size: int = 1,
    accum: int = 1,
    dynamic: bool = False,
    device_type: str = "cuda",
    **overrides: Any,
) -> TunedConfig:
    fields: dict[str, Any] = {
        "per_device_batch_size": 32,
        "num_workers": workers,
        "prefetch_factor": 4,
        "pin_memory": True,
        "persistent_workers": True,
        "precision": precision,
        "world_size": world_size,
        "grad_accum_steps": accum,
        "extra": {"max_frames_in_batch": 12000} if dynamic else {},
    }
    return TunedConfig(
        workload={"name": "cam++", "task": "asr" if dynamic else "speaker-verification"},
        config=TrialConfig(**(fields | overrides)),
        device_type=device_type,
        metrics={"winner": {"status": "ok", "samples_per_second": 100.0}},
        hardware={},
        data={},
        search={},
        created="2025-01-02T03:04:05+00:00",
        autotune_version="0.1.0",
    )


MATRIX = list(itertools.product(PRECISIONS, (0, 4), (1, 4), (False, True)))
MATRIX_IDS = [f"{p}-w{w}-ws{ws}-{'dynamic' if d else 'static'}" for p, w, ws, d in MATRIX]


def parsed(result: Export) -> dict[str, Any]:
    assert result.yaml_text is not None
    data = yaml.safe_load(result.yaml_text)
    assert isinstance(data, dict)
    return data


def argv(command: str | None) -> list[str]:
    assert command is not None
    return shlex.split(command.replace("\\\n", " "))


def notes_text(result: Export) -> str:
    return "\n".join(result.notes)


def test_registry_holds_every_target() -> None:
    assert set(TARGETS) == set(NAMES)


@pytest.mark.parametrize("target", NAMES, ids=NAMES)
@pytest.mark.parametrize(("precision", "workers", "world_size", "dynamic"), MATRIX, ids=MATRIX_IDS)
def test_contract(target: str, precision: str, workers: int, world_size: int, dynamic: bool) -> None:
    tuned = make_tuned(precision=precision, workers=workers, world_size=world_size, dynamic=dynamic)
    result = export(tuned, target)
    assert result.target == target
    assert result.yaml_text is not None or result.python_text is not None
    if result.yaml_text is not None:
        parsed(result)
    if result.python_text is not None:
        ast.parse(result.python_text)
    assert result.notes and all(note.strip() and "\n" not in note for note in result.notes)
    rendered = result.render()
    for part in (result.yaml_text, result.python_text, result.command):
        if part is not None:
            assert part.rstrip() in rendered
    for note in result.notes:
        assert f"# - {note}" in rendered
    assert all(line.startswith("# ") for line in rendered.split("# notes\n")[1].splitlines())


@pytest.mark.parametrize("target", NAMES, ids=NAMES)
def test_exports_a_loaded_result(target: str) -> None:
    tuned = make_tuned(precision="bf16", world_size=2, accum=2)
    assert export(TunedConfig.from_yaml(tuned.to_yaml()), target) == export(tuned, target)


# --- 3D-Speaker -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_3d_speaker_batch_is_global_and_loader_args(world_size: int, workers: int) -> None:
    result = export(make_tuned(workers=workers, world_size=world_size), "3d-speaker")
    data = parsed(result)
    assert data["batch_size"] == 32 * world_size
    assert data["num_workers"] == workers
    args = data["dataloader"]["args"]
    assert data["dataloader"]["obj"] == "torch.utils.data.DataLoader"
    assert args["batch_size"] == "<batch_size>" and args["num_workers"] == "<num_workers>"
    assert args["pin_memory"] is True and args["drop_last"] is True
    if workers:
        assert args["prefetch_factor"] == 4 and args["persistent_workers"] is True
    else:
        assert "prefetch_factor" not in args and "persistent_workers" not in args
    words = argv(result.command)
    assert words[:3] == ["torchrun", f"--nproc_per_node={world_size}", "speakerlab/bin/train.py"]
    assert words[words.index("--config") + 1] == "conf/cam++.yaml"
    assert words[words.index("--gpu") + 1 :] == [str(index) for index in range(world_size)]


@pytest.mark.parametrize("precision", ("bf16", "fp16"))
def test_3d_speaker_says_amp_needs_a_code_change(precision: str) -> None:
    notes = notes_text(export(make_tuned(precision=precision), "3d-speaker"))
    assert "no AMP switch" in notes and "trains fp32" in notes and "torch.autocast" in notes
    assert ("GradScaler" in notes) == (precision == "fp16")


def test_3d_speaker_tf32_and_fp32_notes() -> None:
    assert "apply_backend_flags" in notes_text(export(make_tuned(precision="tf32"), "3d-speaker"))
    notes = notes_text(export(make_tuned(precision="fp32"), "3d-speaker"))
    assert "autocast" not in notes and "strict IEEE" in notes


def test_3d_speaker_has_no_gradient_accumulation() -> None:
    result = export(make_tuned(world_size=2, accum=4), "3d-speaker")
    assert parsed(result)["batch_size"] == 64  # per_device * world_size: what each GPU step holds
    assert "no gradient accumulation" in notes_text(result) and "256" in notes_text(result)


# --- WeNet ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
def test_wenet_batch_is_per_gpu(world_size: int) -> None:
    result = export(make_tuned(world_size=world_size, accum=2), "wenet")
    data = parsed(result)
    assert data["dataset_conf"]["batch_conf"] == {"batch_type": "static", "batch_size": 32}
    assert data["accum_grad"] == 2
    assert f"--nproc_per_node={world_size}" in argv(result.command)


def test_wenet_dynamic_batching() -> None:
    batch_conf = parsed(export(make_tuned(dynamic=True), "wenet"))["dataset_conf"]["batch_conf"]
    assert batch_conf == {"batch_type": "dynamic", "max_frames_in_batch": 12000}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("pin", (True, False), ids=("pin", "nopin"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_wenet_flags(precision: str, pin: bool, workers: int) -> None:
    result = export(make_tuned(precision=precision, workers=workers, pin_memory=pin), "wenet")
    words = argv(result.command)
    assert words[words.index("--num_workers") + 1] == str(workers)
    assert ("--pin_memory" in words) == pin
    assert ("--use_amp" in words) == (precision == "fp16")
    assert "--dtype" not in words
    if workers:
        assert words[words.index("--prefetch") + 1] == "4"
    else:
        assert "--prefetch" not in words and "--num_workers 1 or more" in notes_text(result)


def test_wenet_prefetch_unset_is_torch_default() -> None:
    words = argv(export(make_tuned(prefetch_factor=None), "wenet").command)
    assert words[words.index("--prefetch") + 1] == "2"  # not WeNet's own default of 100


def test_wenet_notes_for_inexpressible_precision() -> None:
    bf16 = notes_text(export(make_tuned(precision="bf16"), "wenet"))
    assert "bf16 cannot be expressed with WeNet's DDP engine" in bf16
    assert "--dtype bf16" in bf16 and "torch_fsdp" in bf16 and "fp16 only" in bf16
    assert "no TF32 setting" in notes_text(export(make_tuned(precision="tf32"), "wenet"))


# --- SpeechBrain ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "expected"), [("fp32", "fp32"), ("tf32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")]
)
def test_speechbrain_precision_and_tf32_quirk(precision: str, expected: str) -> None:
    result = export(make_tuned(precision=precision), "speechbrain")
    assert parsed(result)["precision"] == expected
    words = argv(result.command)
    assert ("SB_DISABLE_QUIRKS=allow_tf32" in words) == (precision == "fp32")
    if precision == "tf32":
        assert "allow_tf32 quirk" in notes_text(result) and "nothing else is needed" in notes_text(result)


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_speechbrain_dataloader_options(world_size: int, workers: int) -> None:
    result = export(make_tuned(precision="bf16", workers=workers, world_size=world_size, accum=3), "speechbrain")
    data = parsed(result)
    options = data["dataloader_options"]
    assert options["batch_size"] == 32  # per process, whatever the world size
    assert options["num_workers"] == workers and options["pin_memory"] is True
    assert data["grad_accumulation_factor"] == 3
    assert ("prefetch_factor" in options) == ("persistent_workers" in options) == (workers > 0)
    assert ("unchanged to torch's DataLoader" in notes_text(result)) == (workers > 0)
    launcher = argv(result.command)[:2]
    assert launcher == (["torchrun", "--nproc_per_node=4"] if world_size > 1 else ["python", "train.py"])


def test_speechbrain_fp16_on_cpu_is_flagged() -> None:
    result = export(make_tuned(precision="fp16", device_type="cpu"), "speechbrain")
    assert "rejects precision fp16 on CPU" in notes_text(result)
    assert "SB_DISABLE_QUIRKS" not in (result.command or "")


# --- ESPnet2 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
def test_espnet_keys(precision: str, world_size: int) -> None:
    result = export(make_tuned(precision=precision, world_size=world_size, accum=2, cudnn_benchmark=False), "espnet")
    data = parsed(result)
    assert data["batch_size"] == 32 * world_size  # total across GPUs; accumulation is separate
    assert data["accum_grad"] == 2 and data["num_workers"] == 4
    assert data["use_amp"] is (precision in ("bf16", "fp16"))
    assert data.get("use_tf32", False) is (precision == "tf32")
    assert data["cudnn_benchmark"] is False and data["cudnn_deterministic"] is False
    words = argv(result.command)
    assert words[words.index("--ngpu") + 1] == str(world_size)
    assert ("--multiprocessing_distributed" in words) == (world_size > 1)


def test_espnet_amp_semantics_are_stated() -> None:
    assert "bfloat16" in notes_text(export(make_tuned(precision="bf16"), "espnet"))
    assert "cannot force fp16" in notes_text(export(make_tuned(precision="fp16"), "espnet"))


def test_espnet_dynamic_batching_is_a_note() -> None:
    result = export(make_tuned(dynamic=True, world_size=2), "espnet")
    assert "batch_size" not in parsed(result)
    assert "batch_bins" in notes_text(result) and "3840000" in notes_text(result)


# --- Lightning --------------------------------------------------------------------------------------------------


def call_kwargs(python_text: str, name: str) -> dict[str, Any]:
    for node in ast.walk(ast.parse(python_text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            return {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
    raise AssertionError(f"no {name}(...) call")


@pytest.mark.parametrize(
    ("precision", "expected"),
    [("fp32", "32-true"), ("tf32", "32-true"), ("bf16", "bf16-mixed"), ("fp16", "16-mixed")],
)
@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
def test_lightning_trainer(precision: str, expected: str, world_size: int) -> None:
    result = export(make_tuned(precision=precision, world_size=world_size, accum=2), "lightning")
    assert result.yaml_text is None and result.python_text is not None
    trainer = call_kwargs(result.python_text, "Trainer")
    assert trainer["precision"] == expected
    assert trainer["devices"] == world_size and trainer["accumulate_grad_batches"] == 2
    assert trainer["accelerator"] == "gpu" and trainer["benchmark"] is True
    assert trainer.get("strategy") == ("ddp" if world_size > 1 else None)
    assert ('set_float32_matmul_precision("high")' in result.python_text) == (precision == "tf32")


@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_lightning_dataloader(workers: int) -> None:
    python_text = export(make_tuned(workers=workers, world_size=4), "lightning").python_text
    assert python_text is not None
    loader = call_kwargs(python_text, "DataLoader")
    assert loader["batch_size"] == 32 and loader["num_workers"] == workers and loader["pin_memory"] is True
    assert ("prefetch_factor" in loader) == ("persistent_workers" in loader) == (workers > 0)


# --- shared behaviour -------------------------------------------------------------------------------------------


def test_world_size_override_scales_global_batch_and_says_so() -> None:
    result = export(make_tuned(world_size=1), "3d-speaker", world_size=4)
    assert parsed(result)["batch_size"] == 128
    assert "Measured with world_size=1" in notes_text(result)
    assert not any("Measured with" in note for note in export(make_tuned(world_size=4), "3d-speaker").notes)


def test_intra_op_threads_reach_the_command() -> None:
    result = export(make_tuned(intra_op_threads=3, world_size=2), "wenet")
    assert argv(result.command)[0] == "OMP_NUM_THREADS=3"
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
