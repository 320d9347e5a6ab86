"""3D-Speaker: the self-contained torchrun command, read by speakerlab's own parser and config builder, and run
through speakerlab/bin/train.py's main() for an epoch on generated audio."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.exports import export
from tests.exports.common import RECIPES, TUNED, bash_words, loader_settings, make_tuned, notes_text
from tests.exports.speakerlab_cpu import cpu_patches

speakerlab = pytest.importorskip("speakerlab", reason="the frameworks extra installs speakerlab")

FILES = json.loads((RECIPES / "speakerlab_files.json").read_text())


def _export(**kwargs: Any):
    return export(make_tuned(model=kwargs.pop("model", "cam++"), **kwargs), "3d-speaker")


def _config(argv: list[str], recipe: Path) -> Any:
    """speakerlab's own parser and config builder, as train.py's main() calls them."""
    from speakerlab.bin.train import parser
    from speakerlab.utils.config import build_config

    args, overrides = parser.parse_known_args(argv)
    return args, build_config(str(recipe), overrides, False)


def test_installed_speakerlab_is_3d_speakers_training_code() -> None:
    root = Path(speakerlab.__file__).parent.parent
    for path, blob in FILES["blobs"].items():
        data = (root / path).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, path


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_command_is_self_contained(world_size: int, workers: int, tmp_path: Path) -> None:
    result = _export(workers=workers, world_size=world_size)
    assert result.yaml_text is None  # nothing to edit: the command carries every value
    _, argv = bash_words(result.command)
    assert argv[:3] == ["torchrun", f"--nproc_per_node={world_size}", "speakerlab/bin/train.py"]
    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    args, config = _config(argv[3:], recipe)
    assert args.config == "conf/cam++.yaml" and args.gpu == [str(index) for index in range(world_size)]
    assert (config.data, config.noise, config.reverb) == (
        "data/vox2_dev/train.csv",
        "data/musan/wav.scp",
        "data/rirs/wav.scp",
    )
    assert config.exp_dir == "exp/cam++"  # run.sh's; unset, build_config(copy=True) calls os.makedirs(None)
    # Global: train.py gives each process int(batch_size / world_size), the tuned per-device 32.
    assert config.batch_size == 32 * world_size and int(config.batch_size / world_size) == 32
    assert config.num_workers == workers
    loader = config.dataloader["args"]
    assert loader["pin_memory"] is True and loader["drop_last"] is True
    assert loader["dataset"] == "<dataset>" and loader["batch_size"] == "<batch_size>"
    if workers:
        assert loader["prefetch_factor"] == 4 and loader["persistent_workers"] is True
    else:
        assert "--dataloader" not in argv and "prefetch_factor" not in loader  # the recipe's own block


def test_eres2net_large_selects_m_channels_64_and_builds_the_published_model(tmp_path: Path) -> None:
    from speakerlab.utils.builder import build

    _, argv = bash_words(_export(model="eres2net-large").command)
    recipe = tmp_path / "eres2net.yaml"
    shutil.copy(RECIPES / "3d-speaker_eres2net.yaml", recipe)
    args, config = _config(argv[3:], recipe)
    assert args.config == "conf/eres2net.yaml" and config.m_channels == 64 and config.exp_dir == "exp/eres2net_large"
    model = build("embedding_model", config)
    assert sum(parameter.numel() for parameter in model.parameters()) == 22_462_784  # as autotune's workload


@pytest.mark.parametrize("precision", ("bf16", "fp16"))
def test_says_amp_needs_a_code_change(precision: str) -> None:
    notes = notes_text(_export(precision=precision))
    assert "no AMP switch" in notes and "trains fp32" in notes and "torch.autocast" in notes
    assert ("GradScaler" in notes) == (precision == "fp16")


def test_tf32_and_fp32_notes() -> None:
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in notes_text(_export(precision="tf32"))
    notes = notes_text(_export(precision="fp32"))
    assert "autocast" not in notes and "strict IEEE" in notes and "NVIDIA_TF32_OVERRIDE=0" in notes
    assert "Measured: fp32-default" in notes_text(_export(precision="fp32-default"))


def test_has_no_gradient_accumulation() -> None:
    result = _export(world_size=2, accum=4)
    _, argv = bash_words(result.command)
    assert argv[argv.index("--batch_size") + 1] == "64"  # per_device * world_size: what each step holds
    assert "no gradient accumulation" in notes_text(result) and "256" in notes_text(result)


@pytest.mark.parametrize("model", ("conformer", "fastspeech2"))
def test_other_tasks_are_refused(model: str) -> None:
    result = _export(model=model)
    assert not result.supported and "speaker-embedding models" in result.notes[0]


# --- speakerlab/bin/train.py's main(), for one epoch on the CPU --------------------------------------------------


def _write_corpus(root: Path) -> None:
    """run.sh's layout: data/vox2_dev/train.csv (3 s chunks), data/musan and data/rirs wav.scp lists."""
    import soundfile

    generator = torch.Generator().manual_seed(0)
    (root / "wav").mkdir()
    rows = ["ID,dur,path,start,stop,spk"]
    for index in range(10):
        path = root / "wav" / f"u{index}.wav"
        soundfile.write(path, (torch.randn(48000, generator=generator) * 0.1).numpy(), 16000)
        rows.append(f"u{index},3.0,{path},0,48000,spk{index % 4}")
    for folder in ("vox2_dev", "musan", "rirs"):
        (root / "data" / folder).mkdir(parents=True)
    (root / "data/vox2_dev/train.csv").write_text("\n".join(rows) + "\n")
    scp = "".join(f"u{index} {root / 'wav' / f'u{index}.wav'}\n" for index in range(2))
    (root / "data/musan/wav.scp").write_text(scp)
    (root / "data/rirs/wav.scp").write_text(scp)


def _on_the_cpu(monkeypatch) -> None:
    """train.py calls CUDA (torch.cuda.set_device, nccl, .cuda()) and torchaudio 2.11's load needs torchcodec: the
    CPU port's patches (tests/exports/speakerlab_cpu.py), undone after the test."""
    for owner, attribute, replacement in cpu_patches():
        monkeypatch.setattr(owner, attribute, replacement)
    for name, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))


def run_train_py(root: Path, monkeypatch, command: str | None) -> tuple[Any, str]:
    """Run a printed 3D-Speaker command's train.py main() for one epoch in `root` (run.sh's folder: conf/, data/,
    exp/); returns the DataLoader train.py built and its train.log."""
    import torch.distributed as dist
    from speakerlab.bin import train

    monkeypatch.chdir(root)
    (root / "conf").mkdir()
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", root / "conf" / "cam++.yaml")
    _write_corpus(root)
    _on_the_cpu(monkeypatch)
    _, argv = bash_words(command, cwd=root)
    built: dict[str, Any] = {}
    original_build = train.build

    def recording_build(name: str, config: Any) -> Any:
        built[name] = original_build(name, config)
        return built[name]

    monkeypatch.setattr(train, "build", recording_build)
    # One epoch; speed perturbation needs torchaudio.sox_effects, gone from torchaudio 2.11 (test only).
    test_only = ["--num_epoch", "1", "--speed_pertub", "False", "--log_batch_freq", "1"]
    monkeypatch.setattr(sys, "argv", [*argv[2:], *test_only])
    try:
        train.main()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return built["dataloader"], (root / "exp/cam++/train.log").read_text()


@pytest.mark.slow
def test_train_py_runs_an_epoch_with_the_tuned_loader(tmp_path: Path, monkeypatch) -> None:
    tuned = make_tuned(
        model="cam++", precision="fp32-default", workers=2, prefetch_factor=3, per_device_batch_size=4, in_order=False
    )
    loader, log = run_train_py(tmp_path, monkeypatch, export(tuned, "3d-speaker").command)
    assert loader_settings(loader) == dict(TUNED, batch_size=4, pin_memory=True)  # a CUDA result: pinned
    assert len(loader) == 2  # 10 chunks, batches of 4, the short one dropped
    assert "Epoch: [1][0/2]" in log and "Epoch: [1][1/2]" in log  # both steps trained
    assert (tmp_path / "exp/cam++/models").is_dir()


def test_the_old_command_failed_in_speakerlabs_config_builder(tmp_path: Path) -> None:
    """Why the command carries exp_dir and overrides: without any override build_config loads an empty string, and
    with the recipe's empty exp_dir it calls os.makedirs(None) (speakerlab/utils/config.py)."""
    from speakerlab.utils.config import build_config

    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    with pytest.raises(TypeError):
        build_config(str(recipe), [], True)
    with pytest.raises(TypeError):
        build_config(str(recipe), ["--batch_size", "64"], True)


@pytest.mark.parametrize("implementation", ("default", "foreach", "fused"))
def test_optimizer_kernel_reaches_speakerlabs_sgd(implementation: str, tmp_path: Path) -> None:
    """--optimizer carries the recipe's SGD block plus the tuned flag; speakerlab's builder makes torch's SGD with it,
    as train.py does (params filled in, then build('optimizer', config)), and it steps."""
    from speakerlab.utils.builder import build

    result = _export(optimizer_impl=implementation)
    _, argv = bash_words(result.command)
    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    _, config = _config(argv[3:], recipe)
    recipe_block = {"obj": "torch.optim.SGD", **_recipe_optimizer("3d-speaker_cam++.yaml")}
    assert _recipe_optimizer("3d-speaker_eres2net.yaml") == _recipe_optimizer("3d-speaker_cam++.yaml")
    if implementation == "default":
        assert "--optimizer" not in argv and config.optimizer == recipe_block
        assert "optimizer_impl" not in notes_text(result)
    else:
        assert config.optimizer == {**recipe_block, "args": {**recipe_block["args"], implementation: True}}
        assert f"optimizer_impl {implementation}" in notes_text(result)
    parameter = torch.nn.Parameter(torch.ones(3))
    config.optimizer["args"]["params"] = [parameter]
    optimizer = build("optimizer", config)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["lr"] == config.lr
    assert optimizer.defaults["foreach"] is (True if implementation == "foreach" else None)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
    parameter.grad = torch.ones(3)
    optimizer.step()
    assert parameter.detach().lt(1).all()


def _recipe_optimizer(name: str) -> dict[str, Any]:
    import yaml

    return {"args": yaml.safe_load((RECIPES / name).read_text())["optimizer"]["args"]}


# --- where speakerlab computes its fbank (feature_device) -----------------------------------------------------------


@pytest.mark.parametrize("placement", (None, "workers", "device"))
def test_feature_placement_note_says_where_speakerlab_computes_fbank(placement: str | None) -> None:
    text = notes_text(_export(feature_device=placement))
    assert ("WavSVDataset.__getitem__" in text) == (placement == "device")


def test_speakerlabs_dataset_computes_the_fbank_the_step_computes(tmp_path: Path, monkeypatch) -> None:
    """speakerlab's own recipe objects, built by its own builder from the exported command: its dataset's item is
    already the fbank (so its DataLoader workers compute it; train.py feeds x to the model as it comes), and its
    FBank of a crop is what the tuned step's batched fbank computes of the same crop."""
    from speakerlab.utils.builder import build

    from autotune.data.features import batched_fbank

    monkeypatch.chdir(tmp_path)
    _write_corpus(tmp_path)
    _on_the_cpu(monkeypatch)
    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    _, argv = bash_words(_export(feature_device="device").command, cwd=tmp_path)
    _, config = _config([*argv[3:], "--speed_pertub", "False"], recipe)  # no sox in torchaudio 2.11 (test only)
    dataset = build("dataset", config)
    features, _ = dataset[0]
    assert features.shape == (298, 80)  # the item is the feature, made in __getitem__
    crops = [dataset.preprocessor["wav_reader"](dataset.get_data(index)["path"])[0] for index in range(3)]
    theirs = torch.stack([dataset.preprocessor["feature_extractor"](crop) for crop in crops])
    torch.testing.assert_close(batched_fbank(torch.stack(crops)), theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("in_order", (True, False))
def test_unordered_workers_reach_the_dataloader_block(in_order: bool, tmp_path: Path) -> None:
    result = _export(in_order=in_order)
    _, argv = bash_words(result.command)
    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    _, config = _config(argv[3:], recipe)
    assert config.dataloader["args"].get("in_order", True) is in_order
    assert ("not see the batches in the same order" in notes_text(result)) == (not in_order)


@pytest.mark.parametrize("checkpointing", (None, True, False))
def test_campplus_checkpointing_reaches_memory_efficient(checkpointing: bool | None, tmp_path: Path) -> None:
    """Tuned off, --embedding_model replaces the recipe's CAM++ block with memory_efficient false; speakerlab's
    parser, config builder and builder then make a CAM++ whose dense layers do not checkpoint. On or unset, the
    recipe's block (DTDNN.CAMPPlus checkpoints by default) is left alone."""
    from speakerlab.utils.builder import build

    result = _export(activation_checkpointing=checkpointing)
    _, argv = bash_words(result.command)
    assert ("--embedding_model" in argv) == (checkpointing is False)
    recipe = tmp_path / "cam++.yaml"
    shutil.copy(RECIPES / "3d-speaker_cam++.yaml", recipe)
    _, config = _config(argv[3:], recipe)
    model = build("embedding_model", config)
    layers = [module for module in model.modules() if hasattr(module, "memory_efficient")]
    assert layers and {layer.memory_efficient for layer in layers} == {checkpointing is not False}
    assert sum(parameter.numel() for parameter in model.parameters()) == 7_176_224  # the recipe's CAM++ still
    assert ("memory_efficient: false" in notes_text(result)) == (checkpointing is False)


def test_3d_speaker_has_no_compile_option_and_the_note_names_where_its_networks_are_built() -> None:
    """speakerlab's own train.py (installed from PyPI) never calls torch.compile and builds its embedding model and
    classifier where the note says to compile them."""
    import speakerlab.bin.train as train

    source = Path(train.__file__).read_text()
    assert "compile" not in source
    assert "build('embedding_model', config)" in source and "build('classifier', config)" in source
    notes = notes_text(_export(compile="default"))
    assert "3D-Speaker has no option for torch.compile: call module.compile() on each network module" in notes
    assert "torch.compile" not in notes_text(_export())
