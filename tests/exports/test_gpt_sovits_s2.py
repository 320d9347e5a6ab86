"""GPT-SoVITS s2: the exported train keys merged into the recipe's s2.json as the webui merges them and read back as
s2_train.py reads it, fp16_run as its only precision switch, the command read by its own flag, and a note with file
and line for every tuned value s2_train.py hard-codes (its DataLoader, cudnn.benchmark and TF32, bf16, AdamW's flags).

The recipe's s2.json is the configuration recorded from RVC-Boss/GPT-SoVITS 48b1a01 in
tests/models/reference/gpt_sovits_s2_v2.json. The webui sets its form's keys into it and writes TEMP/tmp_s2.json with
``json.dumps``; s2_train.py reads it through ``utils.get_hparams(stage=2)``, which parses ``-c/--config`` and
``json.loads`` the file. GPT-SoVITS is not on PyPI; those calls are repeated here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from autotune.exports import export
from tests.exports.common import bash_words, make_tuned, notes_text

REFERENCE = Path(__file__).parents[1] / "models" / "reference" / "gpt_sovits_s2_v2.json"
# The recipe's values: batch 32 per GPU, fp16_run, and s2_train.py's hard-coded DataLoader and cudnn.benchmark.
RECIPE = {
    "per_device_batch_size": 32,
    "workers": 5,
    "persistent_workers": True,
    "prefetch_factor": 3,
    "pin_memory": True,
    "cudnn_benchmark": False,
    "precision": "fp16",
}
WEBUI_KEYS = {"gpu_numbers"}  # train keys the webui adds to s2.json (its form's GPU list)


def s2(**overrides: Any) -> Any:
    return make_tuned(model="gpt-sovits-s2", **{**RECIPE, **overrides})


def recipe_json() -> dict[str, Any]:
    configuration = json.loads(REFERENCE.read_text())["configuration"]
    return {key: value for key, value in configuration.items() if key != "version"}  # the record adds the version


def merged_config(json_text: str, tmp_path: Path) -> dict[str, Any]:
    """The exported keys set into s2.json as the webui sets its form's, written and read as s2_train.py reads it."""
    data = recipe_json()
    for key, value in json.loads(json_text)["train"].items():
        assert key in data["train"] or key in WEBUI_KEYS, f"train.{key} is not a key of s2.json"
        data["train"][key] = value
    path = tmp_path / "tmp_s2.json"
    path.write_text(json.dumps(data))
    return json.loads(path.read_text())


def get_hparams_parser() -> argparse.ArgumentParser:
    """utils.get_hparams's flag for the config."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("-c", "--config", type=str, default="./configs/s2.json")
    return parser


def test_keys_are_the_recipes_and_read_back_as_s2_train_reads_them(tmp_path: Path) -> None:
    result = export(s2(per_device_batch_size=12, precision="fp16", world_size=2), "gpt-sovits")
    config = merged_config(result.yaml_text or "", tmp_path)
    assert config["train"]["batch_size"] == 12 and config["train"]["fp16_run"] is True
    assert config["train"]["gpu_numbers"] == "0-1"  # s2_train.py:9 turns the dashes into CUDA_VISIBLE_DEVICES
    assert config["train"]["learning_rate"] == 1e-4 and config["data"]["hop_length"] == 640  # the rest untouched


def test_the_recipes_own_values_export_as_the_recipe(tmp_path: Path) -> None:
    result = export(s2(), "gpt-sovits")
    config = merged_config(result.yaml_text or "", tmp_path)
    recipe = recipe_json()
    recipe["train"]["gpu_numbers"] = "0"
    assert config == recipe  # batch 32, fp16_run true: nothing changes
    text = notes_text(result)
    assert "hard-codes" not in text and "data_module.py" not in text and "s1_train.py" not in text


@pytest.mark.parametrize(
    ("precision", "device", "fp16_run"),
    [("fp16", "cuda", True), ("bf16", "cuda", False), ("tf32", "cuda", False), ("fp16", "cpu", False)],
)
def test_fp16_run_is_on_for_fp16_on_a_gpu_only(precision: str, device: str, fp16_run: bool) -> None:
    result = export(s2(precision=precision, device_type=device), "gpt-sovits")
    train = json.loads(result.yaml_text or "")["train"]
    assert train["fp16_run"] is fp16_run and ("gpu_numbers" in train) == (device == "cuda")


@pytest.mark.parametrize("world_size", [1, 4])
def test_command_is_s2_train_with_the_webuis_config(world_size: int) -> None:
    result = export(s2(world_size=world_size, intra_op_threads=3), "gpt-sovits")
    environment, argv = bash_words(result.command)
    assert argv[:3] == ["python", "-s", "GPT_SoVITS/s2_train.py"]
    assert get_hparams_parser().parse_args(argv[3:]).config == "TEMP/tmp_s2.json"
    assert environment["OMP_NUM_THREADS"] == "3"
    assert json.loads(result.yaml_text or "")["train"]["gpu_numbers"] == "-".join(map(str, range(world_size)))


def test_what_s2_train_hard_codes_is_named_with_its_file_and_line() -> None:
    tuned = s2(workers=8, prefetch_factor=4, pin_memory=False, cudnn_benchmark=True, optimizer_impl="fused")
    text = notes_text(export(tuned, "gpt-sovits"))
    for tuned_value, recipe in (("num_workers=8", "num_workers=5"), ("prefetch_factor=4", "prefetch_factor=3")):
        assert f"The tuned DataLoader had {tuned_value}; GPT_SoVITS/s2_train.py:119-128 hard-codes {recipe}" in text
    assert "pin_memory=False; GPT_SoVITS/s2_train.py:119-128 hard-codes pin_memory=True" in text
    assert "GPT_SoVITS/s2_train.py:41 hard-codes torch.backends.cudnn.benchmark = False" in text
    assert "fused=True to both torch.optim.AdamW calls (optim_g and optim_d)" in text
    assert "data_module.py" not in text and "t2s_lightning_module.py" not in text  # s1's notes are s1's
    fp16 = notes_text(export(s2(), "gpt-sovits"))
    assert "GPT_SoVITS/s2_train.py:41-46 forces TF32" in fp16  # what autocast leaves in float32
    bf16 = notes_text(export(s2(precision="bf16"), "gpt-sovits"))
    assert "s2.json has no key for it (fp16_run is fp16 only)" in bf16 and "dtype=torch.bfloat16" in bf16
    default = notes_text(export(s2(precision="fp32-default"), "gpt-sovits"))
    assert "measured with IEEE float32 matmuls, but GPT_SoVITS/s2_train.py:41-46 forces TF32" in default
    strict = export(s2(precision="fp32"), "gpt-sovits")
    environment, _ = bash_words(strict.command)
    assert environment.get("NVIDIA_TF32_OVERRIDE") == "0" and "overrides GPT_SoVITS/s2_train.py:41-46" in notes_text(
        strict
    )
    preloaded = notes_text(export(s2(preload_audio=True), "gpt-sovits"))
    assert "starts ffmpeg for every item in its workers" in preloaded


def test_a_cpu_result_names_no_gpus_and_no_pinned_memory() -> None:
    result = export(s2(precision="fp32", device_type="cpu", pin_memory=False), "gpt-sovits")
    text = notes_text(result)
    assert "gpu_numbers" not in (result.yaml_text or "") and "gpu_numbers" not in text and "pin_memory" not in text
    assert "GPT_SoVITS/s2_train.py trains float32 there (its autocast is CUDA's)" in text


def test_workers_off_is_named_once() -> None:
    text = notes_text(export(s2(workers=0), "gpt-sovits"))
    assert "num_workers=0; GPT_SoVITS/s2_train.py:119-128 hard-codes num_workers=5" in text
    assert "prefetch_factor" not in text and "persistent_workers" not in text
