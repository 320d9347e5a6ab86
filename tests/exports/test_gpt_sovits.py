"""GPT-SoVITS: the exported s1 keys merged into the recipe's yaml as the webui merges them and read back as s1_train.py
reads it, the precision strings Lightning takes, and the command read by s1_train.py's own flags.

recipes/gpt_sovits_s1longer_v2.yaml is GPT_SoVITS/configs/s1longer-v2.yaml at RVC-Boss/GPT-SoVITS 48b1a01.
s1_train.py reads its config with AR/utils/io.py load_yaml_config, which is ``yaml.full_load`` (lines 7-10); the
webui loads the recipe's yaml with ``yaml.load(..., Loader=yaml.FullLoader)``, sets its keys and writes it with
``yaml.dump`` (webui.py:603-633). GPT-SoVITS is not on PyPI; those three calls are repeated here.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.exports import export
from tests.exports.common import RECIPES, bash_words, make_tuned, notes_text

RECIPE_YAML = RECIPES / "gpt_sovits_s1longer_v2.yaml"
# The recipe's values: batch 8, 4 workers, persistent workers, prefetch 16, no pin_memory, accumulation 4.
RECIPE = {
    "per_device_batch_size": 8,
    "workers": 4,
    "persistent_workers": True,
    "prefetch_factor": 16,
    "pin_memory": False,
    "accum": 4,
    "cudnn_benchmark": False,
}


def s1(**overrides: Any) -> Any:
    return make_tuned(model="gpt-sovits-s1", **{**RECIPE, **overrides})


def merged_config(yaml_text: str, tmp_path: Path) -> dict[str, Any]:
    """The exported keys set into the recipe's yaml as the webui sets its form's, written and read by s1_train.py."""
    with open(RECIPE_YAML) as file:
        data = yaml.load(file.read(), Loader=yaml.FullLoader)  # webui.py:606-607
    for section, values in yaml.safe_load(yaml_text).items():
        for key, value in values.items():
            assert key in data[section], f"{section}.{key} is not a key of s1longer-v2.yaml"
            data[section][key] = value
    path = tmp_path / "tmp_s1.yaml"
    path.write_text(yaml.dump(data, default_flow_style=False))  # webui.py:632-633
    with open(path) as file:
        return typing.cast(dict[str, Any], yaml.full_load(file))  # AR/utils/io.py:7-10, s1_train.py:86


def s1_train_parser() -> argparse.ArgumentParser:
    """s1_train.py's flags (lines 152-159)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("-c", "--config_file", type=str, default="configs/s1longer.yaml")
    return parser


def test_keys_are_the_recipes_and_read_back_as_s1_train_reads_them(tmp_path: Path) -> None:
    result = export(s1(per_device_batch_size=24, workers=6, precision="bf16"), "gpt-sovits")
    config = merged_config(result.yaml_text or "", tmp_path)
    assert config["train"]["batch_size"] == 24 and config["train"]["precision"] == "bf16-mixed"
    assert config["data"]["num_workers"] == 6
    assert config["train"]["epochs"] == 20 and config["data"]["max_sec"] == 54  # the rest untouched


def test_the_recipes_own_values_export_as_the_recipe(tmp_path: Path) -> None:
    result = export(s1(precision="fp16"), "gpt-sovits")
    recipe = yaml.full_load(RECIPE_YAML.read_text())
    assert merged_config(result.yaml_text or "", tmp_path) == recipe  # batch 8, 16-mixed, 4 workers: nothing changes
    assert "hard-codes" not in notes_text(result) and "grad_accum_steps" not in notes_text(result)


@pytest.mark.parametrize(
    ("precision", "device", "lightning"),
    [("fp16", "cuda", "16-mixed"), ("bf16", "cuda", "bf16-mixed"), ("tf32", "cuda", "32"), ("bf16", "cpu", "32")],
)
def test_precision_is_a_string_lightnings_trainer_takes(precision: str, device: str, lightning: str) -> None:
    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    result = export(s1(precision=precision, device_type=device), "gpt-sovits")
    exported = yaml.safe_load(result.yaml_text or "")["train"]["precision"]
    assert exported == lightning
    assert exported in typing.get_args(_PRECISION_INPUT_STR) + typing.get_args(_PRECISION_INPUT_STR_ALIAS)


@pytest.mark.parametrize("world_size", [1, 4])
def test_command_is_s1_train_on_the_listed_gpus(world_size: int) -> None:
    result = export(s1(world_size=world_size, intra_op_threads=3), "gpt-sovits")
    environment, argv = bash_words(result.command)
    assert argv[:3] == ["python", "-s", "GPT_SoVITS/s1_train.py"]
    assert s1_train_parser().parse_args(argv[3:]).config_file == "TEMP/tmp_s1.yaml"
    assert environment["_CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(world_size))  # s1_train.py:4-5
    assert environment["OMP_NUM_THREADS"] == "3" and environment["hz"] == "25hz" and environment["version"] == "v2"
    assert "use_distributed_sampler=False at GPT_SoVITS/s1_train.py:127 (PR 756" in notes_text(result)


def test_what_the_recipe_hard_codes_is_named_with_its_file_and_line() -> None:
    tuned = s1(precision="fp32-default", cudnn_benchmark=True, accum=2, prefetch_factor=4, pin_memory=True)
    text = notes_text(export(tuned, "gpt-sovits"))
    assert "GPT_SoVITS/s1_train.py:22 hard-codes" in text and '"highest"' in text
    assert "Trainer(benchmark=False) (GPT_SoVITS/s1_train.py:118)" in text
    assert "t2s_lightning_module.py:54-57" in text and "change the 4 there to 2" in text
    for tuned_value in ("prefetch_factor=4", "pin_memory=True"):
        assert f"The tuned DataLoader had {tuned_value}" in text and "data_module.py:53-61" in text
    strict = export(s1(precision="fp32"), "gpt-sovits")
    environment, _ = bash_words(strict.command)
    assert environment.get("NVIDIA_TF32_OVERRIDE") == "0" and "overrides GPT_SoVITS/s1_train.py:22" in notes_text(
        strict
    )
    preloaded = notes_text(export(s1(preload_audio=True), "gpt-sovits"))
    assert "AR/data/dataset.py:224-226" in preloaded


def test_other_workloads_are_refused() -> None:
    result = export(make_tuned(model="naturalspeech2"), "gpt-sovits")
    assert not result.supported and result.notes[0].startswith("gpt-sovits cannot take naturalspeech2: ")
