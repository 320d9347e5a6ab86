"""ESPnet2: the run.sh command, its trainer arguments read by ESPnet's own parsers (SpeakerTask, ASRTask) over the
recorded recipe config, and the DataLoader ESPnet's iterator factory builds from them on generated audio."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autotune.data.buckets import BucketPlan
from autotune.exports import export
from tests.exports.common import PRECISIONS, RECIPES, bash_words, bucket_tuned, make_tuned, notes_text

pytest.importorskip("espnet2", reason="the frameworks extra installs espnet")

SPK_ARGS = json.loads((RECIPES / "espnet_spk_train_args.json").read_text())
SPK_RECIPE = RECIPES / "espnet_train_ecapa_mel.yaml"
ASR_ARGS = json.loads((RECIPES / "espnet_asr_train_args.json").read_text())
ASR_RECIPE = RECIPES / "espnet_train_asr_conformer.yaml"


def _export(**kwargs: Any):
    return export(make_tuned(model=kwargs.pop("model", "ecapa-tdnn"), **kwargs), "espnet")


def run_sh(command: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """run.sh's options (`--name value` pairs, as utils/parse_options.sh reads them) and the environment."""
    environment, argv = bash_words(command)
    assert argv[0] == "./run.sh" and len(argv) % 2 == 1
    return environment, dict(zip(argv[1::2], argv[2::2], strict=True))


def spk_train_argv(options: dict[str, str], root: Path, config: Path) -> list[str]:
    """The spk_train arguments spk.sh's stage 5 builds (recorded), with the recipe's folders under `root`."""
    values = {
        "${spk_exp}": str(root / "exp/spk_train"),
        "${_spk_train_dir}": str(root / "dump/raw/train"),
        "${_spk_valid_dir}": str(root / "dump/raw/valid"),
        "${spk_stats_dir}": str(root / "exp/spk_stats_16k"),
        "${spk_num}": "4",
        "${ignore_init_mismatch}": SPK_ARGS["defaults"]["ignore_init_mismatch"],
        "${fold_length}": SPK_ARGS["defaults"]["fold_length"],
    }
    argv: list[str] = []
    for word in SPK_ARGS["arguments"]:
        if word == "${_opts}":
            argv += ["--config", str(config)]
        elif word == "${spk_args}":
            argv += shlex.split(options["--spk_args"])
        else:
            for name, value in values.items():
                word = word.replace(name, value)
            argv.append(word)
    ngpu = options["--ngpu"]
    return [*argv, "--ngpu", ngpu, "--multiprocessing_distributed", "true" if int(ngpu) > 1 else "false"]


@pytest.mark.slow  # importing ESPnet's tasks takes about 20 s here (librosa, numba)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
@pytest.mark.parametrize("device", ("cuda", "cpu"))
def test_speaker_arguments_parse_in_espnet(precision: str, world_size: int, device: str, tmp_path: Path) -> None:
    from espnet2.tasks.spk import SpeakerTask

    result = _export(precision=precision, world_size=world_size, accum=2, cudnn_benchmark=False, device_type=device)
    environment, options = run_sh(result.command)
    assert options["--stage"] == options["--stop_stage"] == "5"
    assert options["--spk_config"] == "conf/train_ECAPA_mel.yaml"
    assert options["--ngpu"] == (str(world_size) if device == "cuda" else "0")
    args = SpeakerTask.get_parser().parse_args(spk_train_argv(options, tmp_path, SPK_RECIPE))
    assert args.batch_size == 32 * world_size  # total across GPUs; accumulation is separate
    assert args.accum_grad == 2 and args.num_workers == 4 and args.drop_last_iter is True
    assert args.use_amp is (precision in ("bf16", "fp16") and device == "cuda")  # the recipe says true: overridden
    assert args.use_tf32 is (precision == "tf32" and device == "cuda")
    assert args.cudnn_benchmark is False and args.cudnn_deterministic is False
    assert args.iterator_type == "category" and args.batch_type == "folded"  # the recipe's: catbel batches
    assert args.output_dir.endswith("exp/spk_train")
    assert ("NVIDIA_TF32_OVERRIDE" in environment) == (precision == "fp32" and device == "cuda")


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", (False, True), ids=("static", "dynamic"))
def test_conformer_arguments_parse_in_espnet(dynamic: bool) -> None:
    from espnet2.tasks.asr import ASRTask

    result = _export(model="conformer", precision="bf16", world_size=2, accum=4, dynamic=dynamic)
    _, options = run_sh(result.command)
    assert options["--stage"] == "11" and options["--asr_config"] == "conf/train_asr_conformer.yaml"
    args = ASRTask.get_parser().parse_args(shlex.split(options["--asr_args"]))
    assert args.accum_grad == 4 and args.use_amp is True and args.drop_last_iter is True
    if dynamic:
        assert args.batch_type == "folded" and "--batch_size" not in options["--asr_args"]  # left to the recipe
        assert "batch_bins" in notes_text(result) and "3840000" in notes_text(result)
    else:
        assert (args.batch_type, args.batch_size) == ("sorted", 64)


@pytest.mark.slow
def test_bucket_batches_are_a_note_and_the_recipes_batching_stays() -> None:
    """ESPnet's parser takes the arguments with no batch key (the recipe's folded batches stay); the note says why
    per-bucket batch sizes have no ESPnet key, naming its folded sampler's rule (checked in its source)."""
    import inspect

    from espnet2.samplers.folded_batch_sampler import FoldedBatchSampler
    from espnet2.tasks.asr import ASRTask

    assert "int(batch_size / (1 + factor))" in inspect.getsource(FoldedBatchSampler)
    plan = BucketPlan(boundaries=(300, 600), batch_sizes=(40, 20, 10))
    result = export(bucket_tuned(plan, precision="bf16", world_size=2), "espnet")
    _, options = run_sh(result.command)
    args = ASRTask.get_parser().parse_args(shlex.split(options["--asr_args"]))
    assert args.batch_type == "folded" and "--batch_size" not in options["--asr_args"]
    assert "no ESPnet key" in notes_text(result) and "[40, 20, 10]" in notes_text(result)


def test_amp_semantics_are_stated() -> None:
    assert "bfloat16" in notes_text(_export(precision="bf16"))
    assert "cannot force fp16" in notes_text(_export(precision="fp16"))
    cpu = notes_text(_export(precision="bf16", device_type="cpu"))
    assert "torch.cuda.amp" in cpu and "use_amp false" in cpu


def test_speaker_recipe_keeps_category_batches() -> None:
    notes = notes_text(_export())
    assert "category-balanced" in notes and "folded" not in notes and "unsorted" not in notes


@pytest.mark.parametrize("model", ("cam++", "eres2net-large", "fastspeech2"))
def test_models_without_an_espnet_recipe_say_so(model: str) -> None:
    assert not _export(model=model).supported


# --- ESPnet's iterator factory builds the DataLoader from the parsed arguments -------------------------------------


def _write_recipe_data(root: Path) -> None:
    """What spk.sh's stages 1-4 leave: dump/raw (wav.scp, utt2spk, spk2utt, category2utt, trials, musan/rirs lists)
    and exp/spk_stats_16k shape files, over generated audio."""
    import soundfile

    rng = np.random.default_rng(0)
    for folder in ("dump/raw/train", "dump/raw/valid", "exp/spk_stats_16k/train", "exp/spk_stats_16k/valid", "wav"):
        (root / folder).mkdir(parents=True)
    utterances = []
    for index in range(12):
        path = root / "wav" / f"u{index:02d}.wav"
        soundfile.write(path, (rng.standard_normal(32000) * 0.1).astype("float32"), 16000)
        utterances.append((f"spk{index % 4}-u{index:02d}", f"spk{index % 4}", path))
    speakers: dict[str, list[str]] = {}
    for utterance, speaker, _ in utterances:
        speakers.setdefault(speaker, []).append(utterance)
    lists = {
        "dump/raw/train/wav.scp": [f"{u} {p}" for u, _, p in utterances],
        "dump/raw/train/utt2spk": [f"{u} {s}" for u, s, _ in utterances],
        "dump/raw/train/spk2utt": [f"{s} {' '.join(us)}" for s, us in speakers.items()],
        "dump/raw/train/category2utt": [f"{s} {' '.join(us)}" for s, us in speakers.items()],
        "exp/spk_stats_16k/train/speech_shape": [f"{u} 32000" for u, _, _ in utterances],
        "dump/raw/valid/trial.scp": [f"{u} {p}" for u, _, p in utterances[:2]],
        "dump/raw/valid/trial2.scp": [f"{u} {p}" for u, _, p in utterances[:2]],
        "dump/raw/valid/trial_label": [f"{u} 1" for u, _, _ in utterances[:2]],
        "exp/spk_stats_16k/valid/speech_shape": [f"{u} 32000" for u, _, _ in utterances[:2]],
    }
    for name in ("musan_speech", "musan_noise", "musan_music", "rirs"):
        lists[f"dump/raw/{name}.scp"] = [f"{u} {p}" for u, _, p in utterances[:2]]
    for name, lines in lists.items():
        (root / name).write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_iterator_factory_builds_the_tuned_loader(tmp_path: Path, monkeypatch) -> None:
    from espnet2.tasks.spk import SpeakerTask
    from espnet2.train.distributed_utils import DistributedOption

    monkeypatch.chdir(tmp_path)  # the recipe config names dump/raw/... relative to the recipe folder
    _write_recipe_data(tmp_path)
    shutil.copy(SPK_RECIPE, tmp_path / "train_ECAPA_mel.yaml")
    tuned = make_tuned(
        model="ecapa-tdnn", precision="bf16", device_type="cpu", workers=2, per_device_batch_size=4, in_order=False
    )
    exported = export(tuned, "espnet")
    _, options = run_sh(exported.command)
    args = SpeakerTask.get_parser().parse_args(spk_train_argv(options, tmp_path, tmp_path / "train_ECAPA_mel.yaml"))
    SpeakerTask.check_required_command_args(args)
    factory = SpeakerTask.build_iter_factory(args=args, distributed_option=DistributedOption(ngpu=0), mode="train")
    loader = factory.build_iter(1)
    assert factory.sampler_args["batch_size"] == 4 and "category2utt_file" in factory.sampler_args  # catbel
    batches = list(loader.batch_sampler)
    assert batches and all(len(batch) == 4 for batch in batches)  # batch_size 4 (the short last batch dropped)
    assert loader.num_workers == 2 and loader.pin_memory is False  # ESPnet pins only with GPUs
    assert loader.in_order is True  # build_iter passes no in_order: the note says the tuned False cannot reach it
    assert "ESPnet (espnet2/iterators/*_iter_factory.py build_iter) builds its DataLoader without in_order" in (
        notes_text(exported)
    )
    assert args.use_amp is False  # bf16 on a CPU: ESPnet's torch.cuda.amp would do nothing, so it is not asked for


# --- ESPnet's own trainer: the aishell conformer recipe trains an epoch with the exported arguments ----------------
# (The speaker recipe cannot train on numpy 2.4 in ESPnet 202511: SpkPreprocessor calls int() on a one-element
# array, which numpy 2.4 rejects. The ASR recipe takes the same trainer arguments and runs.)


def asr_train_argv(options: dict[str, str], root: Path) -> list[str]:
    """The asr_train arguments asr.sh's stage 11 builds (recorded), with the recipe's folders under `root`."""
    values = {
        "${bpemodel}": "none",
        "${token_type}": "char",
        "${token_list}": str(root / "data/tokens.txt"),
        "${nlsyms_txt}": "none",
        "${cleaner}": "none",
        "${g2p}": "none",
        "${_asr_valid_dir}": str(root / "dump/raw/dev"),
        "${_asr_train_dir}": str(root / "dump/raw/train"),
        "${asr_stats_dir}": str(root / "exp/asr_stats"),
        "${ignore_init_mismatch}": "false",
        "${_fold_length}": "80000",
        "${asr_text_fold_length}": "150",
        "${asr_exp}": str(root / "exp/asr_train"),
        "${asr_config}": str(ASR_RECIPE),
        "${fs}": "16k",
    }
    argv: list[str] = []
    for word in ASR_ARGS["arguments"]:
        if word == "${asr_args}":
            argv += shlex.split(options["--asr_args"])
            continue
        for name, value in values.items():
            word = word.replace(name, value)
        argv.append(word)
    return [*argv, "--ngpu", options["--ngpu"], "--multiprocessing_distributed", "false"]


def _write_asr_data(root: Path, count: int) -> None:
    import soundfile

    rng = np.random.default_rng(0)
    chars = list("abcdefgh")
    for folder in ("dump/raw/train", "dump/raw/dev", "exp/asr_stats/train", "exp/asr_stats/valid", "wav", "data"):
        (root / folder).mkdir(parents=True)
    utterances = []
    for index in range(count):
        path = root / "wav" / f"u{index}.wav"
        soundfile.write(path, (rng.standard_normal(16000) * 0.1).astype("float32"), 16000)
        utterances.append((f"u{index}", path, "".join(rng.choice(chars, 5))))
    for split, stats in (("train", "train"), ("dev", "valid")):
        (root / f"dump/raw/{split}/wav.scp").write_text("".join(f"{u} {p}\n" for u, p, _ in utterances))
        (root / f"dump/raw/{split}/text").write_text("".join(f"{u} {t}\n" for u, _, t in utterances))
        (root / f"exp/asr_stats/{stats}/speech_shape").write_text("".join(f"{u} 16000\n" for u, _, _ in utterances))
        shapes = "".join(f"{u} 5,{len(chars) + 3}\n" for u, _, _ in utterances)
        (root / f"exp/asr_stats/{stats}/text_shape.char").write_text(shapes)
    (root / "data/tokens.txt").write_text("\n".join(["<blank>", "<unk>", *chars, "<sos/eos>"]) + "\n")


@pytest.mark.slow
def test_asr_recipe_trains_an_epoch_with_the_exported_arguments(tmp_path: Path, monkeypatch) -> None:
    import yaml
    from espnet2.tasks.asr import ASRTask

    monkeypatch.chdir(tmp_path)
    _write_asr_data(tmp_path, count=7)
    tuned = make_tuned(
        model="conformer", precision="fp32-default", device_type="cpu", workers=1, per_device_batch_size=2, accum=2
    )
    _, options = run_sh(export(tuned, "espnet").command)
    assert options["--ngpu"] == "0"
    # Test only: a 2+1-block model, one epoch, no attention plots or tensorboard (the tuned values are what is tested).
    small = ["--encoder_conf", "num_blocks=2", "--decoder_conf", "num_blocks=1", "--max_epoch", "1"]
    small += ["--num_att_plot", "0", "--use_tensorboard", "false"]
    args = ASRTask.get_parser().parse_args([*asr_train_argv(options, tmp_path), *small])
    factories: list[Any] = []
    original = ASRTask.build_iter_factory.__func__

    def recording(cls: Any, *args: Any, **kwargs: Any) -> Any:
        factories.append(original(cls, *args, **kwargs))
        return factories[-1]

    monkeypatch.setattr(ASRTask, "build_iter_factory", classmethod(recording))
    ASRTask.main(args=args)
    saved = yaml.safe_load((tmp_path / "exp/asr_train/config.yaml").read_text())  # what ESPnet trained with
    assert (saved["batch_type"], saved["batch_size"], saved["accum_grad"]) == ("sorted", 2, 2)
    assert (saved["num_workers"], saved["drop_last_iter"], saved["use_amp"], saved["use_tf32"]) == (
        1,
        True,
        False,
        False,
    )
    loader = factories[0].build_iter(1)
    assert loader.num_workers == 1 and loader.pin_memory is False
    assert [len(batch) for batch in loader.batch_sampler] == [2, 2, 2]  # 7 utterances: the short batch dropped
    assert (tmp_path / "exp/asr_train/1epoch.pth").exists()


@pytest.mark.slow  # ESPnet's task import (see above)
@pytest.mark.parametrize("implementation", ("default", "fused"))
def test_optimizer_kernel_reaches_espnets_optimizer(implementation: str, tmp_path: Path) -> None:
    """--optim_conf fused=true is merged into the recipe's optim_conf, and ESPnet's build_optimizers hands it to
    torch's Adam; `default` leaves the recipe's optim_conf as it is."""
    import torch
    from espnet2.tasks.spk import SpeakerTask

    result = _export(optimizer_impl=implementation)
    _, options = run_sh(result.command)
    args = SpeakerTask.get_parser().parse_args(spk_train_argv(options, tmp_path, SPK_RECIPE))
    recipe = {"lr": 0.001, "weight_decay": 0.00005, "amsgrad": False}  # train_ECAPA_mel.yaml's optim_conf
    assert args.optim == "adam"
    assert args.optim_conf == (recipe if implementation == "default" else {**recipe, implementation: True})
    (optimizer,) = SpeakerTask.build_optimizers(args, torch.nn.Linear(4, 2))
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
    assert ("optimizer_impl fused" in notes_text(result)) == (implementation == "fused")


def test_checkpointing_cannot_reach_espnets_conformer() -> None:
    """ESPnet's ConformerEncoder takes no checkpointing argument (its own signature): the note says so."""
    import inspect

    from espnet2.asr.encoder.conformer_encoder import ConformerEncoder

    assert not [name for name in inspect.signature(ConformerEncoder).parameters if "checkpoint" in name]
    result = export(make_tuned(model="conformer", activation_checkpointing=True), "espnet")
    assert "activation_checkpointing was tuned on for conformer; ESPnet" in notes_text(result)
    assert "activation_checkpointing" not in notes_text(export(make_tuned(model="conformer"), "espnet"))


def test_espnet_has_no_compile_option_and_the_note_names_where_the_model_is_built() -> None:
    """ESPnet's own parsers (SpeakerTask, ASRTask) take no torch.compile option: a compiled winner is a note naming
    abs_task.py's main_worker, where the installed ESPnet builds the model."""
    import inspect

    from espnet2.tasks.abs_task import AbsTask
    from espnet2.tasks.asr import ASRTask
    from espnet2.tasks.spk import SpeakerTask

    for task in (SpeakerTask, ASRTask):
        options = [option for action in task.get_parser()._actions for option in action.option_strings]
        assert options and not [option for option in options if "compile" in option]
    assert "model = cls.build_model(args=args)" in inspect.getsource(AbsTask.main_worker)
    notes = notes_text(_export(compile="dynamic"))
    assert "ESPnet has no option for torch.compile" in notes and "module.compile(dynamic=True)" in notes
    assert "main_worker, after cls.build_model(args=args)" in notes
    assert "torch.compile" not in notes_text(_export())


@pytest.mark.parametrize(
    ("device_type", "pinned", "said"), [("cpu", True, True), ("cuda", False, True), ("cpu", False, False)]
)
def test_a_pin_memory_espnet_does_not_follow_is_said(device_type, pinned, said):
    """ESPnet pins exactly when it trains on GPUs (pin_memory=ngpu>0): a tuned value that differs gets a note."""
    notes = notes_text(_export(device_type=device_type, pin_memory=pinned))
    assert ("pin" in notes and "ngpu>0" in notes) is said
