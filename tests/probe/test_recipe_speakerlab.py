"""`--recipe 3d-speaker`: each candidate as speakerlab/bin/train.py's own overrides (the global batch, the workers,
the dataloader block), from the table the 3D-Speaker export writes with, read back by speakerlab's own parser and
config builder; refused before any trial where train.py cannot run (no GPU: it trains on CUDA only); and a real trial
of speakerlab's own train.py through the CPU port (tests/exports/speakerlab_cpu.py), its values read back."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import UserError
from autotune.exports import recipe_input
from autotune.exports.recipes import recipe_command
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for
from tests.probe.recipe_run import measure_export_again, tune

pytest.importorskip("speakerlab")
RECORDED = Path(__file__).resolve().parents[1] / "exports" / "recipes" / "3d-speaker_cam++.yaml"
CPU_PORT = Path(__file__).resolve().parents[1] / "exports" / "speakerlab_cpu.py"
# COMMAND on one rank, through the CPU port, without speed perturbation (torchaudio here has no sox_effects), and
# with 1-second crops (the recipe's 3: a third of the steps' work on a CPU, the same code).
CPU_COMMAND = (
    f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=1 cpu/speakerlab/bin/train.py "
    "--config conf/cam++.yaml --gpu 0 --data data/train.csv --noise data/musan/wav.scp --reverb data/rirs/wav.scp "
    "--exp_dir exp/cam++ --speed_pertub False --wav_len 1.0"
)
COMMAND = (
    "torchrun --nproc_per_node=2 speakerlab/bin/train.py --config conf/cam++.yaml --gpu 0 1 "
    "--data data/train.csv --noise data/musan/wav.scp --reverb data/rirs/wav.scp --exp_dir exp/cam++"
)


REAL_AUDIO_STACK = recipe_input.audio_stack


@pytest.fixture(autouse=True)
def audio_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU node's stack as the recipe needs it (torchaudio 2.8: sox_effects, load without torchcodec); the real
    stack of this environment is checked in its own test below."""
    monkeypatch.setattr(recipe_input, "audio_stack", lambda: (True, None))


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """egs/voxceleb/sv-cam++ as the user has it: its conf/cam++.yaml (recorded from 3D-Speaker 09e7806)."""
    (tmp_path / "conf").mkdir()
    shutil.copy(RECORDED, tmp_path / "conf" / "cam++.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _speakerlab_config(argv: list[str], recipe: Path):  # noqa: ANN202 - speakerlab's Config
    """speakerlab's own parser and config builder, as train.py's main() calls them."""
    from speakerlab.bin.train import parser
    from speakerlab.utils.config import build_config

    args, overrides = parser.parse_known_args(argv[argv.index("speakerlab/bin/train.py") + 1 :])
    return build_config(str(recipe / args.config), overrides, False)


def test_each_candidate_reaches_speakerlabs_config_as_the_export_writes_it(recipe: Path) -> None:
    command, baseline = recipe_command("3d-speaker", COMMAND)
    assert baseline == ["per_device_batch_size=128", "num_workers=16", "pin_memory=true"]  # 256 global over 2 ranks
    assert set(command.knobs) == {
        "per_device_batch_size",
        "num_workers",
        "pin_memory",
        "prefetch_factor",
        "persistent_workers",
    }
    config = spec_for(
        recipe, per_device_batch_size=32, num_workers=4, prefetch_factor=3, persistent_workers=True
    ).config
    built = _speakerlab_config(command.argv(config, None), recipe)
    assert built.batch_size == 64 and built.num_workers == 4  # train.py gives each of 2 ranks 64 / 2
    loader = built.dataloader["args"]
    assert loader["prefetch_factor"] == 3 and loader["persistent_workers"] is True and loader["drop_last"] is True
    assert loader["dataset"] == "<dataset>"  # the recipe's own reference, resolved when train.py builds it
    without = _speakerlab_config(command.argv(spec_for(recipe, per_device_batch_size=32).config, None), recipe)
    assert without.dataloader["args"]["prefetch_factor"] is None  # what torch's DataLoader takes without workers
    assert TrainingCommand.from_dict(command.to_dict()).argv(config, None) == command.argv(config, None)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("python train.py --config conf/cam++.yaml", "the command does not run speakerlab/bin/train.py"),
        ("torchrun speakerlab/bin/train.py --gpu 0", "the command names no --config"),
        ("torchrun speakerlab/bin/train.py --config conf/missing.yaml", "cannot read conf/missing.yaml"),
        (COMMAND + " --batch_size 64", "the command sets --batch_size itself"),
    ],
)
def test_a_3d_speaker_command_autotune_cannot_run_is_one_line(recipe: Path, command: str, words: str) -> None:
    with pytest.raises(UserError) as raised:
        recipe_command("3d-speaker", command)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_without_a_gpu_the_run_is_refused_before_any_trial(recipe: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--recipe", "3d-speaker", "--command", COMMAND], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "--recipe 3d-speaker: speakerlab/bin/train.py trains on CUDA only" in result.output
    assert not (recipe / "results").exists()


def test_this_environments_torchaudio_is_checked_against_the_recipes_reader_before_any_trial(
    recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """speakerlab's WavReader (the recipe's wav_reader) speed-perturbs with torchaudio.sox_effects and reads with
    torchaudio.load: torchaudio 2.9 removed the first and reads through torchcodec. What this environment's torchaudio
    does, tried for real, decides; a stack that has both passes."""
    monkeypatch.setattr(recipe_input, "audio_stack", REAL_AUDIO_STACK)
    sox_effects, load_error = REAL_AUDIO_STACK()
    if sox_effects and load_error is None:
        recipe_command("3d-speaker", COMMAND)
        return
    with pytest.raises(UserError) as raised:
        recipe_command("3d-speaker", COMMAND)
    message = str(raised.value)
    assert "\n" not in message
    if not sox_effects:
        assert "speed-perturbs through torchaudio.sox_effects (speed_pertub: True in conf/cam++.yaml)" in message
        assert "add --speed_pertub False" in message
    else:
        assert "reads each file with torchaudio.load, which fails here" in message


@pytest.mark.parametrize(
    ("stack", "extra", "words"),
    [
        ((False, None), "", "speed_pertub: True in conf/cam++.yaml"),
        ((False, None), " --speed_pertub True", "(--speed_pertub)"),
        ((False, None), " --speed_pertub False", None),
        ((True, "ImportError: TorchCodec is required"), "", "which fails here (ImportError: TorchCodec is required)"),
        ((False, "ImportError: TorchCodec is required"), " --speed_pertub False", "pip install torchcodec"),
    ],
)
def test_a_reader_that_cannot_run_is_refused_and_one_that_can_passes(
    recipe: Path, monkeypatch: pytest.MonkeyPatch, stack: tuple[bool, str | None], extra: str, words: str | None
) -> None:
    monkeypatch.setattr(recipe_input, "audio_stack", lambda: stack)
    if words is None:
        command, _ = recipe_command("3d-speaker", COMMAND + extra)
        assert "--speed_pertub False" in command.template
        return
    with pytest.raises(UserError, match=re.escape(words)):
        recipe_command("3d-speaker", COMMAND + extra)


def test_a_reader_of_the_users_own_is_not_second_guessed(recipe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = recipe / "conf" / "cam++.yaml"
    config.write_text(config.read_text().replace("speakerlab.process.processor.WavReader", "mine.reader.Reader"))
    monkeypatch.setattr(recipe_input, "audio_stack", lambda: (False, "ImportError: TorchCodec is required"))
    recipe_command("3d-speaker", COMMAND)


@pytest.fixture
def cpu_recipe(recipe: Path, corpus: Path) -> Path:
    """run.sh's folder as its data stages leave it, over the test corpus (4 speakers, 96 files of 2.5-4 s): a
    train.csv with one row a whole file, noise and reverb lists of two of its files; and the CPU port of train.py at
    cpu/speakerlab/bin/train.py."""
    from autotune.data import load_source

    utterances = load_source(str(corpus)).utterances
    rows = [f"{u.utt_id},{u.duration_s},{u.path},0,{u.duration_s},{u.speaker}" for u in utterances]
    for folder in ("musan", "rirs"):
        (recipe / "data" / folder).mkdir(parents=True)
        (recipe / "data" / folder / "wav.scp").write_text("".join(f"{u.utt_id} {u.path}\n" for u in utterances[:2]))
    (recipe / "data" / "train.csv").write_text("\n".join(["ID,dur,path,start,stop,spk", *rows]) + "\n")
    (recipe / "cpu" / "speakerlab" / "bin").mkdir(parents=True)
    shutil.copy(CPU_PORT, recipe / "cpu" / "speakerlab" / "bin" / "train.py")
    return recipe


@pytest.mark.slow
def test_a_3d_speaker_trial_trains_through_speakerlabs_train_py_with_the_values_in_force(
    cpu_recipe: Path, tmp_path: Path
) -> None:
    """One trial as `--recipe 3d-speaker` runs it, through speakerlab's own train.py on the CPU (the port changes
    only its CUDA calls and its decoder; no sox here, so no speed perturbation): the probe reads back every value the
    candidate asked for from the DataLoader train.py built, and checks the rank's epoch against the train.csv."""
    command, _ = recipe_command("3d-speaker", CPU_COMMAND)
    spec = spec_for(tmp_path, per_device_batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True)
    result = CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=300)
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    for knob in ("per_device_batch_size", "num_workers", "prefetch_factor", "persistent_workers", "pin_memory"):
        assert verdicts[knob]["in_force"] is True, verdicts[knob]
    assert result.observed["per_device_batch_size"] == 4 and result.observed["num_workers"] == 2  # type: ignore[index]
    epoch = result.epoch_accounting or {}
    assert epoch["sampler"] == "DistributedSampler" and "unchecked" not in epoch  # train.py's own sampler, checked
    assert (epoch["dataset_size"], epoch["batches_per_epoch_per_rank"], epoch["samples_per_epoch"]) == (96, [24], 96)
    assert result.samples_per_second > 0  # type: ignore[operator]


@pytest.mark.slow
def test_a_value_a_patched_train_py_ignores_is_reported(cpu_recipe: Path, tmp_path: Path) -> None:
    """The user's own copy of train.py pins its loader's workers after the config is built: the override autotune
    passed is read back as not in force, with the value the training ran with."""
    import speakerlab.bin.train

    source = Path(speakerlab.bin.train.__file__).read_text()
    pinned = "    train_dataloader = build('dataloader', config)\n"
    assert pinned in source  # speakerlab 0.0.6's train.py, as the patch expects it
    patched = source.replace(pinned, "    config.dataloader['args']['num_workers'] = 1\n" + pinned)
    (cpu_recipe / "cpu" / "speakerlab" / "bin" / "patched_train.py").write_text(patched)
    port = cpu_recipe / "cpu" / "speakerlab" / "bin" / "train.py"
    port.write_text(
        port.read_text().replace(
            "    from speakerlab.bin import train\n",
            "    import patched_train as train  # the user's copy, beside this script (on sys.path as its folder)\n",
        )
    )
    command, _ = recipe_command("3d-speaker", CPU_COMMAND)
    spec = spec_for(tmp_path, per_device_batch_size=4, num_workers=2, prefetch_factor=2)
    result = CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=300)
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    assert verdicts["num_workers"]["in_force"] is False
    assert verdicts["num_workers"]["note"].startswith("num_workers: your training ran with 1, not 2")
    assert verdicts["per_device_batch_size"]["in_force"] is True


@pytest.mark.slow
def test_a_3d_speaker_recipe_is_tuned_and_its_command_measured_again(
    cpu_recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`autotune run --recipe 3d-speaker` end to end through speakerlab's train.py (the CPU port stands in for the
    GPU node, so the run's no-GPU refusal is lifted here), then the exported command measured again under the probe."""
    from autotune.run import runner

    monkeypatch.setattr(runner, "check_device", lambda framework, device_type: None)
    config = cpu_recipe / "conf" / "cam++.yaml"  # the recipe's batch of 256 is more than the 96 files hold
    config.write_text(config.read_text().replace("\nbatch_size: 256\n", "\nbatch_size: 16\n"))
    result_path, tuned = tune("3d-speaker", CPU_COMMAND, cpu_recipe)
    assert tuned.metrics["winner"]["in_force"]["num_workers"]["in_force"]
    line = measure_export_again(result_path, tuned, tmp_path)
    assert f"--batch_size {tuned.config.per_device_batch_size} --num_workers {tuned.config.num_workers}" in line
