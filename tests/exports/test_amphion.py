"""Amphion: the exported train keys merged into the recipe's configuration by Amphion's own rule, and the command read
by accelerate launch's flags.

recipes/amphion_ns2_train.json is the recipe's train section as Amphion's own reader returns it (utils/util.py
_load_config of egs/tts/NaturalSpeech2/exp_config.json and its base configs, run at open-mmlab/Amphion d3de90f0;
Amphion is not on PyPI). The accelerate flags are those of accelerate 1.15's launch_command_parser, which read the
exported commands when they were written (accelerate is not a test dependency).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import torch

from autotune.exports import export
from tests.exports.common import RECIPES, bash_words, make_tuned, notes_text

RECIPE_TRAIN = json.loads((RECIPES / "amphion_ns2_train.json").read_text())["train"]
NS2_KNOBS = {"batch_type": "dynamic", "max_frames_in_batch": 15000, "max_sentences": 48}


def amphion_override(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """utils/util.py override_config: nested dicts merged key by key, other values replaced."""
    for key, value in new.items():
        base[key] = amphion_override(base.get(key, {}), value) if isinstance(value, dict) else value
    return base


def launch_parser() -> argparse.ArgumentParser:
    """The flags of `accelerate launch` the export uses (accelerate/commands/launch.py), the script, its args."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--multi_gpu", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def ns2(**overrides: Any) -> Any:
    return make_tuned(model="naturalspeech2", **{"workload_knobs": NS2_KNOBS, **overrides})


def test_train_keys_are_the_recipes_and_merge_as_amphion_merges_them() -> None:
    result = export(ns2(workers=6, accum=2, pin_memory=False), "amphion")
    train = json.loads(result.yaml_text or "")["train"]
    recipe = json.loads(json.dumps(RECIPE_TRAIN))

    def same_keys(exported: dict[str, Any], section: dict[str, Any]) -> None:
        for key, value in exported.items():
            assert key in section, f"{key} is not a key of the recipe's train section"
            if isinstance(value, dict):
                same_keys(value, section[key])
            else:
                assert type(value) is type(section[key]), key

    same_keys(train, recipe)
    merged = amphion_override(recipe, train)
    assert merged["max_tokens"] == 15000 and merged["max_sentences"] == 48 and merged["use_dynamic_batchsize"]
    assert merged["dataloader"] == {"num_worker": 6, "pin_memory": False}
    assert merged["gradient_accumulation_step"] == 2 and merged["lr_warmup_steps"] == 5000  # the rest untouched


def test_the_recipes_own_values_export_as_the_recipe() -> None:
    recipe = {"prefetch_factor": None, "persistent_workers": False}  # torch's defaults: what the recipe passes
    baseline = make_tuned(model="naturalspeech2", workers=16, precision="tf32", **recipe)
    baseline = export(baseline, "amphion")
    train = json.loads(baseline.yaml_text or "")["train"]
    for key in ("max_tokens", "max_sentences", "gradient_accumulation_step", "dataloader"):
        assert train[key] == RECIPE_TRAIN[key]  # no knobs named: the recipe's 7500 and 32
    assert "hard-codes" not in notes_text(baseline)


def test_fused_adamw_reaches_torch_through_train_adam() -> None:
    train = json.loads(export(ns2(optimizer_impl="fused"), "amphion").yaml_text or "")["train"]
    merged = amphion_override(json.loads(json.dumps(RECIPE_TRAIN)), train)
    assert merged["adam"] == {"lr": 1e-4, "fused": True}
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **merged["adam"])  # ns2_trainer.py:355-359
    assert optimizer.defaults["fused"] is True


@pytest.mark.parametrize(
    ("precision", "world_size", "device", "mixed"),
    [("bf16", 1, "cuda", "bf16"), ("fp16", 4, "cuda", "fp16"), ("tf32", 2, "cuda", "no"), ("bf16", 1, "cpu", "no")],
)
def test_command_is_accelerate_launch(precision: str, world_size: int, device: str, mixed: str) -> None:
    result = export(ns2(precision=precision, world_size=world_size, device_type=device), "amphion")
    _, argv = bash_words(result.command)
    assert argv[:2] == ["accelerate", "launch"]
    args = launch_parser().parse_args(argv[2:])
    assert (args.num_processes, args.mixed_precision) == (world_size, mixed)
    assert args.multi_gpu == (world_size > 1) and args.cpu == (device == "cpu")
    assert args.training_script == "bins/tts/train.py"
    assert args.training_script_args[:2] == ["--config", "egs/tts/NaturalSpeech2/exp_config.json"]


def test_what_the_recipe_hard_codes_is_named_with_its_file_and_line() -> None:
    text = notes_text(export(ns2(precision="fp32-default", cudnn_benchmark=False, in_order=False), "amphion"))
    assert "bins/tts/train.py:36" in text and "the recipe hard-codes this" in text
    assert "bins/tts/train.py:42" in text and "cudnn.benchmark" in text
    for tuned in ("prefetch_factor=4", "persistent_workers=True", "in_order=False"):
        assert f"add {tuned} to that call" in text and "ns2_trainer.py:287-295" in text
    strict = export(ns2(precision="fp32"), "amphion")  # NVIDIA's override beats train.py's allow_tf32
    environment, _ = bash_words(strict.command)
    assert environment.get("NVIDIA_TF32_OVERRIDE") == "0" and "bins/tts/train.py:36 and :39" in notes_text(strict)
    preloaded = notes_text(export(ns2(preload_audio=True), "amphion"))
    assert "ns2_dataset.py:187-196" in preloaded and "preload all data into memory" in preloaded


def test_other_workloads_are_refused() -> None:
    result = export(make_tuned(model="fastspeech2"), "amphion")
    assert not result.supported and result.notes[0].startswith("amphion cannot take fastspeech2: ")
