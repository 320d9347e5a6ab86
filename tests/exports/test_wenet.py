"""WeNet: the printed command against wenet/bin/train.py's argument list, its --override_config rule and its
DataLoader construction, all recorded from wenet-e2e/wenet 0154699 (WeNet is not on PyPI)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from autotune.data.buckets import plan_buckets
from autotune.exports import export
from tests.exports.common import PRECISIONS, RECIPES, bash_words, bucket_tuned, make_tuned, notes_text, parsed

RECORDED = json.loads((RECIPES / "wenet_train_args.json").read_text())
RECIPE = yaml.safe_load((RECIPES / "wenet_train_conformer.yaml").read_text())
_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "list_of_str": lambda text: [part for part in text.split(",") if part],
}


def wenet_parser() -> argparse.ArgumentParser:
    """wenet/bin/train.py's parser rebuilt from the recorded add_argument calls."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for entry in RECORDED["arguments"]:
        kwargs = {key: value for key, value in entry.items() if key not in ("flags", "defined_in", "type")}
        if "type" in entry:
            kwargs["type"] = _TYPES[entry["type"]]
        parser.add_argument(*entry["flags"], **kwargs)
    return parser


def parse(command: str | None) -> tuple[dict[str, str], argparse.Namespace]:
    environment, argv = bash_words(command)
    assert argv[0] == "torchrun" and "wenet/bin/train.py" in argv
    script = argv.index("wenet/bin/train.py")
    return environment, wenet_parser().parse_args(argv[script + 1 :])


def override(configs: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """WeNet's override_config rule (recorded): 'dotted.key value', the key must exist, the value takes its type."""
    result = json.loads(json.dumps(configs))
    for item in items:
        key, value = item.split()
        *path, last = key.split(".")
        node = result
        for part in path:
            node = node[part]
        assert last in node, f"{key} is not in the recipe: WeNet's override_config would fail"
        node[last] = type(node[last])(value) if not isinstance(node[last], bool) else value in ("true", "True")
    return result


def wenet_loader(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    """The train DataLoader as init_dataset_and_dataloader builds it from the arguments (recorded)."""
    assert RECORDED["dataloader"]["kwargs"]["persistent_workers"] is True
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        pin_memory=args.pin_memory,
        num_workers=args.num_workers,
        persistent_workers=True,
        prefetch_factor=args.prefetch,
    )


def _export(**kwargs: Any):
    return export(make_tuned(model="conformer", **kwargs), "wenet")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("pin", (True, False), ids=("pin", "nopin"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
@pytest.mark.parametrize("device", ("cuda", "cpu"))
def test_command_parses_and_its_loader_runs(precision: str, pin: bool, workers: int, device: str) -> None:
    result = _export(precision=precision, workers=workers, pin_memory=pin, device_type=device, accum=2)
    _, args = parse(result.command)
    assert args.num_workers == max(workers, 1) and args.pin_memory == pin
    assert args.prefetch == (4 if workers else 2)  # not WeNet's own default of 100
    assert args.use_amp == (precision == "fp16" and device == "cuda") and args.dtype == "fp32"
    assert args.train_engine == "torch_ddp" and args.model_dir == "exp/conformer"
    assert (args.device, args.dist_backend) == (("cuda", "nccl") if device == "cuda" else ("cpu", "gloo"))
    configs = override(RECIPE, args.override_config)
    assert configs["dataset_conf"]["batch_conf"] == {"batch_type": "static", "batch_size": 32}
    assert configs["accum_grad"] == 2
    loader = wenet_loader(args)  # torch's DataLoader validates these when built: at 0 workers it raises
    assert (loader.num_workers, loader.prefetch_factor) == (args.num_workers, args.prefetch)
    if workers == 0:
        assert "--num_workers 1" not in notes_text(result) and "1 worker with prefetch 2" in notes_text(result)


def test_zero_workers_as_printed_before_fails_in_wenets_loader() -> None:
    args = wenet_parser().parse_args(
        ["--config", "c", "--model_dir", "m", "--train_data", "t", "--cv_data", "v", "--num_workers", "0"]
    )
    with pytest.raises(ValueError):
        wenet_loader(args)


def test_dynamic_batching_is_yaml_because_override_config_cannot_add_a_key() -> None:
    result = _export(dynamic=True, world_size=2)
    _, args = parse(result.command)
    assert parsed(result) == {"dataset_conf": {"batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 12000}}}
    with pytest.raises(AssertionError, match="not in the recipe"):
        override(RECIPE, ["dataset_conf.batch_conf.max_frames_in_batch 12000"])
    assert not any("batch_size" in item for item in args.override_config)


def test_bucket_batches_are_the_batch_conf_wenets_code_ran_with() -> None:
    """The exported batch_conf is the one WeNet's own bucket batching was run with at the recorded commit
    (tests/exports/recipes/wenet_bucket_batches.json, whose batches our sampler forms: tests/data/test_buckets.py),
    and passes dataset.py's checks for batch_type bucket; the batch size is not overridden."""
    recorded = json.loads((RECIPES / "wenet_bucket_batches.json").read_text())
    plan = plan_buckets(recorded["frames"], num_buckets=6, max_frames_in_batch=16000, scaling=1.5)
    result = export(bucket_tuned(plan, world_size=2), "wenet")
    batch_conf = parsed(result)["dataset_conf"]["batch_conf"]
    assert batch_conf == recorded["batch_conf"]
    # wenet/dataset/dataset.py (batch_type bucket) and datapipes.py BucketBySequenceLengthDataPipe's assertions
    assert batch_conf["batch_type"] in ("static", "bucket", "dynamic")
    assert "bucket_boundaries" in batch_conf and "bucket_batch_sizes" in batch_conf
    assert len(batch_conf["bucket_batch_sizes"]) == len(batch_conf["bucket_boundaries"]) + 1
    _, args = parse(result.command)
    assert not any("batch_size" in item for item in args.override_config)
    assert any("bucket_boundaries[i]" in note for note in result.notes)


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
def test_batch_is_per_gpu(world_size: int) -> None:
    result = _export(world_size=world_size, accum=2)
    _, argv = bash_words(result.command)
    assert f"--nproc_per_node={world_size}" in argv
    assert "global batch 256" in notes_text(result) if world_size == 4 else "global batch 64" in notes_text(result)


def test_bf16_says_what_wenet_bf16_is() -> None:
    notes = notes_text(_export(precision="bf16"))
    assert "cannot be expressed with WeNet's DDP engine" in notes and "--train_engine torch_fsdp --dtype bf16" in notes
    assert "MixedPrecision(param_dtype, reduce_dtype, buffer_dtype all bfloat16)" in notes
    assert "gradients all-reduced in bf16" in notes and "DDP-like" not in notes
    fsdp = wenet_parser().parse_args(
        [
            "--config",
            "c",
            "--model_dir",
            "m",
            "--train_data",
            "t",
            "--cv_data",
            "v",
            "--train_engine",
            "torch_fsdp",
            "--dtype",
            "bf16",
            "--fsdp_sharding_strategy",
            "no_shard",
        ]
    )
    assert fsdp.dtype == "bf16"  # the advice parses


def test_tf32_and_drop_last_notes() -> None:
    environment, _ = parse(_export(precision="tf32").command)
    assert environment == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    assert "no drop_last" in notes_text(_export())


@pytest.mark.parametrize("model", ("cam++", "ecapa-tdnn", "fastspeech2"))
def test_non_asr_models_are_refused(model: str) -> None:
    assert not export(make_tuned(model=model), "wenet").supported


def test_recorded_argument_list_names_its_source() -> None:
    source = RECORDED["source"]
    assert source["repository"] == "wenet-e2e/wenet" and source["commit"].startswith("0154699")
    flags = {entry["flags"][0] for entry in RECORDED["arguments"]}
    assert {"--num_workers", "--prefetch", "--pin_memory", "--use_amp", "--device", "--override_config"} <= flags


def wenet_optimizer(configs: dict[str, Any], model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer init_optimizer_and_scheduler builds from a config (recorded): optim_conf as keyword arguments."""
    rule = RECORDED["optimizer"]
    conf = {key: value for key, value in configs["optim_conf"].items() if key not in rule["removed_keys"]}
    module, name = rule["optim_keys"][configs["optim"]].rsplit(".", 1)
    assert module == "torch.optim"
    return getattr(torch.optim, name)(model.parameters(), **conf)


@pytest.mark.parametrize("implementation", ("default", "foreach", "fused"))
@pytest.mark.parametrize("dynamic", (False, True), ids=("static", "dynamic"))
def test_optimizer_kernel_is_yaml_in_optim_conf(implementation: str, dynamic: bool) -> None:
    """optim_conf has no fused/foreach key for override_config to set: the flag is a config edit, beside the recipe's
    lr, and WeNet's optimizer construction hands it to torch's Adam."""
    result = _export(optimizer_impl=implementation, dynamic=dynamic)
    with pytest.raises(AssertionError, match="not in the recipe"):
        override(RECIPE, ["optim_conf.fused true"])
    edits = parsed(result) if (dynamic or implementation != "default") else {}
    assert result.yaml_text is None or edits
    if implementation == "default":
        assert "optim_conf" not in edits and "optimizer_impl" not in notes_text(result)
    else:
        assert edits["optim_conf"] == {**RECIPE["optim_conf"], implementation: True}
        assert f"optimizer_impl {implementation}" in notes_text(result)
    assert ("dataset_conf" in edits) == dynamic
    configs = {**RECIPE, "optim_conf": {**RECIPE["optim_conf"], **edits.get("optim_conf", {})}}
    optimizer = wenet_optimizer(configs, torch.nn.Linear(4, 2))
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.defaults["lr"] == 0.002
    assert optimizer.defaults["foreach"] is (True if implementation == "foreach" else None)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)


def test_unordered_workers_cannot_reach_wenets_loader() -> None:
    """init_dataset_and_dataloader passes no in_order (recorded): WeNet's loader runs in order, and the note says so."""
    assert "in_order" not in RECORDED["dataloader"]["kwargs"]
    result = _export(in_order=False)
    _, args = parse(result.command)
    assert wenet_loader(args).in_order is True
    assert "WeNet (wenet/utils/train_utils.py init_dataset_and_dataloader) builds its DataLoader without in_order" in (
        notes_text(result)
    )
    assert "in_order" not in notes_text(_export(in_order=True))


@pytest.mark.parametrize("checkpointing", (None, True, False))
def test_checkpointing_is_yaml_in_encoder_and_decoder_conf(checkpointing: bool | None) -> None:
    """WeNet's switch (recorded from its encoder and decoder) is a key the aishell recipe does not have, so
    override_config cannot set it: a config edit, as optim_conf's."""
    recorded = RECORDED["gradient_checkpointing"]
    assert recorded["config_keys"] == ["encoder_conf.gradient_checkpointing", "decoder_conf.gradient_checkpointing"]
    with pytest.raises(AssertionError, match="not in the recipe"):
        override(RECIPE, ["encoder_conf.gradient_checkpointing true"])
    result = _export(activation_checkpointing=checkpointing)
    edits = parsed(result) if checkpointing else {}
    for key in recorded["config_keys"]:
        section, name = key.split(".")
        merged = {**RECIPE[section], **edits.get(section, {})}
        assert merged.get(name, recorded["default"]) is bool(checkpointing)
    assert ("gradient_checkpointing: true" in notes_text(result)) == bool(checkpointing)


def test_wenet_has_no_compile_flag_and_the_note_says_where_to_compile() -> None:
    """WeNet's train.py arguments (recorded from wenet-e2e/wenet, RECORDED['source']) have no torch.compile flag;
    its main() builds the model with `model, configs = init_model(args, configs)` and then scripts it in
    trace_and_print_model (wenet-e2e/wenet wenet/bin/train.py, read at 010ff41)."""
    flags = [flag for argument in RECORDED["arguments"] for flag in argument["flags"]]
    assert "--config" in flags and not [flag for flag in flags if "compile" in flag]
    notes = " ".join(_export(compile="dynamic").notes)
    assert "WeNet (train.py has no such flag) has no option for torch.compile" in notes
    assert "wenet/bin/train.py, after init_model(args, configs) and trace_and_print_model" in notes
    assert "torch.compile" not in " ".join(_export().notes)


def test_the_feature_placement_note_says_how_to_move_fbank_and_spec_aug_into_the_step() -> None:
    """WeNet has no option for it: a device winner's note names the processor chain (wenet/dataset/dataset.py maps
    processor.compute_fbank and processor.spec_aug at 0154699) and the step (wenet/utils/train_utils.py
    batch_forward), and says what exporting without the change costs; the recipe's placement needs no note."""
    for placement in (None, "workers"):
        assert "feature_device" not in notes_text(_export(feature_device=placement))
    note = notes_text(_export(feature_device="device"))
    for words in ("wenet/dataset/dataset.py", "batch_forward", "compute_fbank and spec_aug", "its own frames"):
        assert words in note
    # The places it names, as recorded from WeNet's source (tests/exports/recipes/wenet_feature_placement.json).
    recorded = json.loads((Path(__file__).parent / "recipes" / "wenet_feature_placement.json").read_text())["facts"]
    for fact in recorded:
        assert fact["file"] in note
    recorded_text = " ".join(fact["text"] for fact in recorded)  # and each recorded line is the place it names
    for word in ("processor.compute_fbank", "processor.spec_aug", "def batch_forward("):
        assert word in recorded_text
    assert "as exported, its workers do the work the tuned run took off them" in note
