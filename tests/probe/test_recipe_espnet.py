"""`autotune run --recipe espnet --command '...'`: ESPnet2's ASR trainer (`python -m espnet2.bin.asr_train`, as
asr.sh's training stage calls it) trained by ESPnet's own code on a tiny prepared corpus, each candidate written as
the trainer's own arguments from the table the ESPnet export writes with; every value read back; a value a patched
trainer ignores reported; a winner found end to end."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.errors import UserError
from autotune.exports.espnet import AMP_WORDS, TRAINER_OPTIONS
from autotune.exports.recipes import recipe_command
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for
from tests.probe.recipe_run import measure_export_again, tune

pytest.importorskip("espnet2")
runner = CliRunner()
RECIPE = Path(__file__).resolve().parents[2] / "examples" / "espnet_recipe"
DATA = " ".join(
    f"--{split}_data_path_and_name_and_type data/{split}/wav.scp,speech,sound "
    f"--{split}_data_path_and_name_and_type data/{split}/text,text,text "
    f"--{split}_shape_file data/{split}/speech_shape --{split}_shape_file data/{split}/text_shape"
    for split in ("train", "valid")
)
ARGS = f"--config conf/train_asr_tiny.yaml {DATA} --output_dir exp/asr --ngpu 0"
COMMAND = f"{sys.executable} -m espnet2.bin.asr_train {ARGS}"
# A user's copy of asr_train.py that pins the loader's workers after parsing: the tuned value never arrives.
PINNED_TRAINER = """from espnet2.tasks.asr import ASRTask

args = ASRTask.get_parser().parse_args()
args.num_workers = 0
ASRTask.main(args=args)
"""


@pytest.fixture
def recipe(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's config and the test corpus prepared as asr.sh's data stages leave it, in a folder of its own."""
    sys.path.insert(0, str(RECIPE))
    try:
        from prepare import prepare  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(RECIPE))
    project = tmp_path / "recipe"
    shutil.copytree(RECIPE / "conf", project / "conf")
    prepare(corpus, project / "data")
    monkeypatch.chdir(project)
    return project


def test_the_recipe_command_carries_each_knob_as_the_trainers_argument(recipe: Path) -> None:
    command, baseline = recipe_command("espnet", COMMAND)
    assert baseline == ["per_device_batch_size=8", "num_workers=0", "precision=fp32-default"]
    assert set(command.knobs) == set(TRAINER_OPTIONS)
    assert command.precisions["cpu"] == ("fp32",)  # ESPnet's autocast is CUDA's; a CPU has no TF32
    spec = spec_for(recipe, per_device_batch_size=4, num_workers=2, precision="fp32-default")
    argv = command.argv(spec.config, None)
    assert argv[-6:] == ["--batch_size", "4", "--num_workers", "2", "--use_amp", AMP_WORDS["fp32-default"]]
    on_gpus, _ = recipe_command("espnet", COMMAND.replace("--ngpu 0", "--ngpu 4"))
    gpu_argv = on_gpus.argv(spec_for(recipe, per_device_batch_size=4, precision="bf16").config, None)
    assert gpu_argv[-6:] == ["--batch_size", "16", "--num_workers", "0", "--use_amp", "true"]  # the total of 4 GPUs
    again = TrainingCommand.from_dict(command.to_dict())  # as a result records it, for the export
    assert again.argv(spec.config, None) == argv


def test_a_batch_type_that_counts_utterances_given_in_the_command_is_tunable(recipe: Path) -> None:
    text = (recipe / "conf" / "train_asr_tiny.yaml").read_text().replace("batch_type: sorted", "batch_type: numel")
    (recipe / "conf" / "train_asr_tiny.yaml").write_text(text)
    command, _ = recipe_command("espnet", COMMAND + " --batch_type folded")
    assert command.recipe == "espnet"


@pytest.mark.parametrize(
    ("command", "config_change", "words"),
    [
        (COMMAND.replace("espnet2.bin.asr_train", "espnet2.bin.tts_train"), None, "runs ESPnet2's ASR trainer"),
        ("./run.sh --stage 11 --ngpu 0", None, "not run.sh or asr.sh"),
        (COMMAND.replace("--config conf/train_asr_tiny.yaml", ""), None, "the command names no --config"),
        (COMMAND.replace("train_asr_tiny", "missing"), None, "cannot read --config conf/missing.yaml"),
        (COMMAND + " --batch_size 16", None, "the command sets --batch_size itself"),
        (COMMAND + " --num_workers=2", None, "the command sets --num_workers itself"),
        (COMMAND + " --use_amp true", None, "the command sets --use_amp itself"),
        (COMMAND, ("batch_type: sorted", "batch_type: numel"), "batch_type numel (from conf/train_asr_tiny.yaml"),
        (COMMAND, ("batch_type: sorted", "batch_type: length"), "tune batch_bins yourself"),
        (COMMAND, ("batch_type: sorted\n", ""), None),  # ESPnet's default, folded: tunable
        (COMMAND, ("batch_type: sorted", "batch_type: sorted\niterator_type: chunk"), "iterator_type chunk"),
        (COMMAND, ("batch_type: sorted", "- [unclosed"), "is not YAML"),
        (COMMAND + " --ngpu two", None, "--ngpu two is not a number of GPUs"),
    ],
)
def test_a_recipe_autotune_cannot_run_is_one_line(
    recipe: Path, command: str, config_change: tuple[str, str] | None, words: str | None
) -> None:
    if config_change is not None:
        path = recipe / "conf" / "train_asr_tiny.yaml"
        path.write_text(path.read_text().replace(*config_change))
    if words is None:
        assert recipe_command("espnet", command)[0].recipe == "espnet"
        return
    with pytest.raises(UserError) as raised:
        recipe_command("espnet", command)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_the_trainers_defaults_are_the_baseline_where_the_config_has_none(recipe: Path) -> None:
    path = recipe / "conf" / "train_asr_tiny.yaml"
    path.write_text(path.read_text().replace("batch_size: 8\n", "").replace("num_workers: 0\n", ""))
    _, baseline = recipe_command("espnet", COMMAND)
    assert baseline == ["per_device_batch_size=20", "num_workers=1", "precision=fp32-default"]  # abs_task.py's


def _trial(command: TrainingCommand, tmp_path: Path, **config: object):  # type: ignore[no-untyped-def]
    spec = spec_for(tmp_path, **config)
    return CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=240)


@pytest.mark.slow
def test_an_espnet_trial_trains_with_the_knobs_in_force(recipe: Path, tmp_path: Path) -> None:
    command, _ = recipe_command("espnet", COMMAND)
    result = _trial(command, tmp_path, per_device_batch_size=4, num_workers=1, precision="fp32-default")
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    for knob in ("per_device_batch_size", "num_workers", "precision"):
        assert verdicts[knob]["in_force"] is True, verdicts[knob]
    assert result.observed["per_device_batch_size"] == 4  # type: ignore[index]
    assert result.samples_per_second > 0  # type: ignore[operator]


@pytest.mark.slow
def test_a_value_a_patched_trainer_ignores_is_reported(recipe: Path, tmp_path: Path) -> None:
    trainer = recipe / "local" / "espnet2" / "bin" / "asr_train.py"
    trainer.parent.mkdir(parents=True)
    trainer.write_text(PINNED_TRAINER)
    command, _ = recipe_command("espnet", f"{sys.executable} local/espnet2/bin/asr_train.py {ARGS}")
    result = _trial(command, tmp_path, per_device_batch_size=4, num_workers=1, precision="fp32-default")
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    assert verdicts["num_workers"]["in_force"] is False
    assert verdicts["num_workers"]["note"].startswith("num_workers: your training ran with 0, not 1")
    assert verdicts["per_device_batch_size"]["in_force"] is True


@pytest.mark.slow
def test_an_espnet_recipe_is_tuned_and_its_command_measured_again(recipe: Path, tmp_path: Path) -> None:
    result_path, tuned = tune("espnet", COMMAND, recipe)
    assert result_path.parent.name == "asr_train"  # named after the module it runs
    assert tuned.config.precision == "fp32"
    assert tuned.metrics["winner"]["in_force"]["num_workers"]["in_force"]
    line = measure_export_again(result_path, tuned, tmp_path)
    assert f"--batch_size {tuned.config.per_device_batch_size}" in line
