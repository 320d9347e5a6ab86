"""`autotune run --recipe wenet --command '...'`: WeNet's own wenet/bin/train.py under torchrun, each candidate written
as train.py's own arguments from the table the WeNet export writes with; every value read back; a value a patched
train.py ignores reported; a winner found end to end and its exported command measured again.

WeNet is not on PyPI and its code is not vendored here: the tests that run it need AUTOTUNE_WENET_ROOT, a checkout
(wenet/, with its requirements importable in this environment); the others run a stand-in checkout whose train.py
imports nothing, which is all autotune's own side reads.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import UserError
from autotune.exports import recipe_input
from autotune.exports.base import TARGET_KNOBS
from autotune.exports.recipes import recipe_command
from autotune.exports.wenet import BATCH_KEY, FLAG_WORDS, LOADER_FLAGS
from autotune.probe.command import COMMAND_KNOBS, TrainingCommand
from autotune.probe.launcher import CommandLauncher
from tests.probe.conftest import spec_for
from tests.probe.recipe_run import measure_export_again, tune

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wenet_recipe"
WENET_ROOT = os.environ.get("AUTOTUNE_WENET_ROOT")
needs_wenet = pytest.mark.skipif(
    not WENET_ROOT,
    reason="AUTOTUNE_WENET_ROOT names no WeNet checkout: WeNet is not on PyPI and its code is not vendored here",
)
ARGS = (
    "wenet/bin/train.py --device cpu --ddp.dist_backend gloo --config conf/train_conformer_tiny.yaml "
    "--data_type raw --train_data data/train/data.list --cv_data data/dev/data.list --model_dir exp/conformer"
)
COMMAND = f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=1 {ARGS}"
# What a stand-in checkout's train_utils.py declares, as WeNet's add_dataset_args does.
STAND_IN_UTILS = """def add_dataset_args(parser):
    parser.add_argument('--num_workers', default=0, type=int)
    parser.add_argument('--prefetch', default=100, type=int)
"""


def _recipe_folder(project: Path, wenet_code: Path) -> Path:
    """The recipe folder as run.sh's data stages leave it: conf/, data/, exp/conformer and a `wenet` link."""
    shutil.copytree(EXAMPLE / "conf", project / "conf")
    (project / "wenet").symlink_to(wenet_code)
    (project / "exp" / "conformer").mkdir(parents=True)
    return project


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recipe folder over a stand-in checkout (a wenet package whose train.py imports nothing)."""
    code = tmp_path / "checkout" / "wenet"
    for package in ("", "bin", "utils"):
        (code / package).mkdir(parents=True, exist_ok=True)
        (code / package / "__init__.py").write_text("")
    (code / "bin" / "train.py").write_text("")
    (code / "utils" / "train_utils.py").write_text(STAND_IN_UTILS)
    project = _recipe_folder(tmp_path / "recipe", code)
    for name in ("train/data.list", "dev/data.list", "train/global_cmvn", "dict/lang_char.txt"):
        (project / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (project / "data" / name).write_text("")
    monkeypatch.setenv("PYTHONPATH", str(code.parent))
    monkeypatch.chdir(project)
    # the audio stack WeNet's reader needs (torchcodec, or torchaudio 2.8): checked for real in the WeNet tests below
    monkeypatch.setattr(recipe_input, "audio_stack", lambda: (True, None))
    return project


def test_each_candidate_is_train_pys_own_arguments_as_the_export_writes_them(stand_in: Path) -> None:
    given = " --num_workers 2 --prefetch 10 --pin_memory --override_config 'accum_grad 1'"
    command, baseline = recipe_command("wenet", COMMAND + given)
    assert baseline == [  # the command's own values, the config's batch_size
        "per_device_batch_size=8",
        "num_workers=2",
        "prefetch_factor=10",
        "pin_memory=true",
        "precision=fp32-default",
    ]
    assert set(command.knobs) == {*LOADER_FLAGS, *FLAG_WORDS, "per_device_batch_size"}
    assert command.precisions["cpu"] == ("fp32",) and command.least == {"num_workers": 1}
    spec = spec_for(stand_in, per_device_batch_size=4, num_workers=3, prefetch_factor=5, precision="fp32")
    argv = command.argv(spec.config, None)
    assert argv.count("--num_workers") == 1 and "--pin_memory" not in argv  # the command's own are replaced
    assert argv[argv.index("--override_config") + 1] == "accum_grad 1"  # the user's other overrides stay
    assert argv[-6:] == ["--num_workers", "3", "--prefetch", "5", "--override_config", f"{BATCH_KEY} 4"]
    on_gpu = spec_for(stand_in, per_device_batch_size=4, num_workers=1, pin_memory=True, precision="fp16")
    assert command.argv(on_gpu.config, None)[-8:] == [
        *("--num_workers", "1", "--prefetch", "2", "--pin_memory", "--use_amp"),  # prefetch unset: torch's default
        *("--override_config", f"{BATCH_KEY} 4"),
    ]
    again = TrainingCommand.from_dict(command.to_dict())  # as a result records it, for the export
    assert again.argv(spec.config, None) == argv


def test_the_recipe_searches_what_the_export_can_write_and_nothing_else(stand_in: Path) -> None:
    command, _ = recipe_command("wenet", COMMAND)
    table = TARGET_KNOBS["wenet"]
    for name in COMMAND_KNOBS:
        if name in command.knobs:
            assert table[name].how, name  # carried: the export writes it too
    left_out = {"persistent_workers", "cudnn_benchmark", "intra_op_threads"}
    assert not left_out & set(command.knobs)


def test_train_pys_defaults_are_the_baseline_where_the_command_has_none(stand_in: Path) -> None:
    _, baseline = recipe_command("wenet", COMMAND)
    # --num_workers 0 (WeNet's default) cannot run its loader: the baseline is the least that does
    assert baseline[1:3] == ["num_workers=1", "prefetch_factor=100"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("-m torch.distributed.run --standalone --nproc_per_node=1 ", ""), "runs WeNet's wenet/bin/train.py under"),
        (("wenet/bin/train.py", "train.py"), "runs WeNet's wenet/bin/train.py under"),
        (("--config conf/train_conformer_tiny.yaml", ""), "the command names no --config"),
        (("train_conformer_tiny", "missing"), "cannot read --config conf/missing.yaml"),
        (("--ddp.dist_backend gloo", ""), "add --ddp.dist_backend gloo"),
        (("--device cpu", "--device cpu --train_engine deepspeed"), "--train_engine deepspeed"),
        (("exp/conformer", "exp/other"), "--model_dir exp/other is not a folder here: make it first"),
        (("data/dev/data.list", "data/test/data.list"), "--cv_data data/test/data.list is not a file here"),
        (("--device cpu", "--device cpu --override_config 'dataset_conf.batch_conf.batch_sise 4'"), "batch_sise is"),
        (("--device cpu", "--device cpu --override_config accum_grad"), "is not 'key.path value'"),
    ],
)
def test_a_recipe_autotune_cannot_run_is_one_line(stand_in: Path, change: tuple[str, str], words: str) -> None:
    with pytest.raises(UserError) as raised:
        recipe_command("wenet", COMMAND.replace(*change))
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("batch_type: 'static'", "batch_type: 'dynamic'"), "batch_type dynamic"),
        (("        batch_size: 8\n", ""), "has no dataset_conf.batch_conf.batch_size"),
        (("symbol_table_path: 'data/dict/lang_char.txt'", "symbol_table_path: 'x.txt'"), "symbol_table_path x.txt"),
    ],
)
def test_a_config_wenet_would_reject_is_one_line(stand_in: Path, change: tuple[str, str], words: str) -> None:
    path = stand_in / "conf" / "train_conformer_tiny.yaml"
    path.write_text(path.read_text().replace(*change))
    with pytest.raises(UserError) as raised:
        recipe_command("wenet", COMMAND)
    assert words in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("stack", "perturb", "words"),
    [
        ((False, None), "true", "speed_perturb true, which WeNet applies with torchaudio.sox_effects"),
        ((False, None), "false", None),
        ((True, "ImportError: TorchCodec is required"), "false", "pip install torchcodec"),
    ],
)
def test_an_audio_stack_wenets_reader_cannot_run_on_is_one_line(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch, stack: tuple[bool, str | None], perturb: str, words: str | None
) -> None:
    """WeNet's decode_wav reads with torchaudio.load and its speed_perturb uses torchaudio.sox_effects: torchaudio 2.9
    reads through torchcodec and has no sox_effects (recipe_input.audio_stack tries both for real)."""
    monkeypatch.setattr(recipe_input, "audio_stack", lambda: stack)
    command = COMMAND + f" --override_config 'dataset_conf.speed_perturb {perturb}'"
    if words is None:
        recipe_command("wenet", command)
        return
    with pytest.raises(UserError) as raised:
        recipe_command("wenet", command)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_code_that_does_not_import_is_one_line_with_the_fix(stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (stand_in / "wenet" / "bin" / "train.py").write_text("import deepspeed_is_not_here\n")
    with pytest.raises(UserError) as raised:
        recipe_command("wenet", COMMAND)
    assert "No module named 'deepspeed_is_not_here'" in str(raised.value) and "requirements.txt" in str(raised.value)
    monkeypatch.delenv("PYTHONPATH")
    with pytest.raises(UserError) as raised:
        recipe_command("wenet", COMMAND)
    assert "No module named 'wenet'" in str(raised.value) and "path.sh" in str(raised.value)


def test_the_recipe_option_names_wenet(stand_in: Path) -> None:
    result = runner.invoke(app, ["run", "--recipe", "kaldi", "--command", COMMAND], catch_exceptions=False)
    assert result.exit_code == 2 and "3d-speaker, espnet, speechbrain, wenet" in result.output
    result = runner.invoke(app, ["run", "--help"], catch_exceptions=False)
    assert "wenet" in result.output


@pytest.fixture
def recipe(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recipe folder over the checkout AUTOTUNE_WENET_ROOT names, its data the test corpus prepared as run.sh's
    data stages leave it; the checkout first on PYTHONPATH, as path.sh puts it."""
    assert WENET_ROOT is not None
    sys.path.insert(0, str(EXAMPLE))
    try:
        from prepare import prepare  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLE))
    project = _recipe_folder(tmp_path / "recipe", Path(WENET_ROOT) / "wenet")
    prepare(corpus, project / "data")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [WENET_ROOT, os.environ.get("PYTHONPATH")])))
    monkeypatch.chdir(project)
    return project


def _trial(command: TrainingCommand, tmp_path: Path, **config: object):  # type: ignore[no-untyped-def]
    spec = spec_for(tmp_path, **config)
    return CommandLauncher(command=command)(spec, workdir=tmp_path / "trial", timeout_s=300)


@needs_wenet
@pytest.mark.slow
def test_a_wenet_trial_trains_with_the_knobs_in_force(recipe: Path, tmp_path: Path) -> None:
    command, _ = recipe_command("wenet", COMMAND)
    result = _trial(command, tmp_path, per_device_batch_size=4, num_workers=2, prefetch_factor=3, precision="fp32")
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    for knob in ("per_device_batch_size", "num_workers", "prefetch_factor", "pin_memory", "precision"):
        assert verdicts[knob]["in_force"] is True, verdicts[knob]
    assert result.observed["per_device_batch_size"] == 4  # type: ignore[index]
    assert result.samples_per_second > 0  # type: ignore[operator]


@needs_wenet
@pytest.mark.slow
def test_a_value_a_patched_train_py_ignores_is_reported(
    recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "patched"  # the user's own checkout, whose train.py pins the loader's workers
    shutil.copytree(Path(str(WENET_ROOT)) / "wenet", checkout / "wenet")
    train = checkout / "wenet" / "bin" / "train.py"
    train.write_text(
        train.read_text().replace("    args = get_args()\n", "    args = get_args()\n    args.num_workers = 1\n")
    )
    (recipe / "wenet").unlink()
    (recipe / "wenet").symlink_to(checkout / "wenet")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(checkout), os.environ["PYTHONPATH"]]))
    command, _ = recipe_command("wenet", COMMAND)
    result = _trial(command, tmp_path, per_device_batch_size=4, num_workers=2, prefetch_factor=2, precision="fp32")
    assert result.status == "ok", result.reason + result.log_tail
    verdicts = result.in_force or {}
    assert verdicts["num_workers"]["in_force"] is False
    assert verdicts["num_workers"]["note"].startswith("num_workers: your training ran with 1, not 2")
    assert verdicts["per_device_batch_size"]["in_force"] is True


@needs_wenet
@pytest.mark.slow
def test_a_wenet_recipe_is_tuned_and_its_command_measured_again(recipe: Path, tmp_path: Path) -> None:
    result_path, tuned = tune("wenet", COMMAND + " --num_workers 1 --prefetch 4", recipe)
    assert tuned.metrics["winner"]["in_force"]["num_workers"]["in_force"]
    line = measure_export_again(result_path, tuned, tmp_path)
    assert f"'{BATCH_KEY} {tuned.config.per_device_batch_size}'" in line
