"""SpeechBrain: the ECAPA-TDNN recipe's command, read by SpeechBrain's own parser, merged into the recorded recipe by
hyperpyyaml, and trained a few steps by a Brain on generated audio."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.exports import export
from autotune.result.tuned_config import TunedConfig
from tests.exports.common import RECIPES, TUNED, bash_words, cpu_result, loader_settings, make_tuned, notes_text

RECIPE = RECIPES / "speechbrain_train_ecapa_tdnn.yaml"  # speechbrain/speechbrain 9c826ef, recorded


def _export(**kwargs: Any):
    return export(make_tuned(model=kwargs.pop("model", "ecapa-tdnn"), **kwargs), "speechbrain")


@pytest.mark.parametrize(
    ("precision", "flag", "environment"),
    [
        ("fp32", None, {"SB_DISABLE_QUIRKS": "allow_tf32", "NVIDIA_TF32_OVERRIDE": "0"}),
        ("fp32-default", None, {"SB_DISABLE_QUIRKS": "allow_tf32"}),
        ("tf32", None, {}),  # SpeechBrain's allow_tf32 quirk: TF32 on at import
        ("bf16", "bf16", {}),
        ("fp16", "fp16", {}),
    ],
)
def test_precision_and_tf32_quirk(precision: str, flag: str | None, environment: dict[str, str]) -> None:
    result = _export(precision=precision)
    assigned, argv = bash_words(result.command)
    assert assigned == environment
    assert ("--precision" in argv) == (flag is not None)
    if flag:
        assert argv[argv.index("--precision") + 1] == flag
    if precision == "tf32":
        assert "allow_tf32 quirk" in notes_text(result) and "nothing else is needed" in notes_text(result)


@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_command_names_the_recipe_and_merges_dataloader_options(world_size: int, workers: int) -> None:
    result = _export(precision="bf16", workers=workers, world_size=world_size, accum=3)
    _, argv = bash_words(result.command)
    launcher = ["torchrun", "--nproc_per_node=4"] if world_size > 1 else ["python"]
    assert argv[: len(launcher) + 2] == [*launcher, "train_speaker_embeddings.py", "hparams/train_ecapa_tdnn.yaml"]
    assert argv[argv.index("--grad_accumulation_factor") + 1] == "3"
    options = argv[argv.index("--dataloader_options") + 1]
    assert "batch_size: 32" in options and f"num_workers: {workers}" in options and "drop_last: true" in options
    assert ("prefetch_factor" in options) == ("persistent_workers" in options) == (workers > 0)
    assert "shuffle" not in options  # merged: the recipe's own shuffle stays


def test_cpu_result_names_the_device_and_never_asks_for_fp16() -> None:
    result = _export(precision="fp16", device_type="cpu")
    assigned, argv = bash_words(result.command)
    assert "--precision" not in argv and argv[argv.index("--device") + 1] == "cpu" and not assigned
    assert "rejects --precision fp16 there" in notes_text(result)


@pytest.mark.parametrize("model", ("cam++", "eres2net", "conformer", "fastspeech2"))
def test_models_without_a_speechbrain_recipe_say_so(model: str) -> None:
    result = _export(model=model)
    assert not result.supported
    if model == "conformer":
        assert "train_dataloader_opts" in result.notes[0] and "speech-translation" in result.notes[0]


# --- SpeechBrain's own machinery ---------------------------------------------------------------------------------


def _quirk_state(environment: dict[str, str]) -> str:
    code = "import speechbrain; from autotune.knobs.precision import fp32_math; print(fp32_math())"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path.cwd()), **environment}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_fp32_default_environment_leaves_torch_defaults_after_speechbrain_import() -> None:
    """Importing speechbrain turns TF32 matmuls on (its quirk); the fp32-default command's environment keeps torch's
    own defaults (matmuls IEEE, cuDNN convolutions TF32), as fp32-default was measured."""
    assigned, _ = bash_words(_export(precision="fp32-default").command)
    assert "'matmul': 'tf32'" in _quirk_state({})
    assert "'matmul': 'ieee', 'cudnn_conv': 'tf32'" in _quirk_state(assigned)


class _Dataset(torch.utils.data.Dataset):
    """1 s of generated audio per item, four speakers."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.waves = torch.randn(count, 16000, generator=generator) * 0.1
        self.labels = torch.arange(count) % 4

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.waves[index], self.labels[index]


def _brain_class() -> Any:
    import speechbrain as sb

    class SpeakerBrain(sb.Brain):
        """The recipe's forward pass (fbank -> mean norm -> ECAPA -> classifier -> AAM loss), without augmentation."""

        loaders: list[Any]
        seen: list[tuple[int, bool, torch.dtype]]

        def make_dataloader(self, dataset, stage, ckpt_prefix="dataloader-", **loader_kwargs):  # noqa: ANN001
            loader = super().make_dataloader(dataset, stage, ckpt_prefix, **loader_kwargs)
            self.loaders.append(loader)
            return loader

        def compute_forward(self, batch, stage):  # noqa: ANN001
            waves, _ = batch
            self.seen.append((int(waves.shape[0]), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            lengths = torch.ones(waves.shape[0])
            features = self.modules.mean_var_norm(self.modules.compute_features(waves), lengths)
            return self.modules.classifier(self.modules.embedding_model(features, lengths))

        def compute_objectives(self, predictions, batch, stage):  # noqa: ANN001
            _, labels = batch
            return self.hparams.compute_cost(predictions, labels.unsqueeze(1))

    return SpeakerBrain


@pytest.mark.slow
def test_recipe_trains_with_the_tuned_values(tmp_path: Path, monkeypatch) -> None:
    import speechbrain as sb
    from hyperpyyaml import load_hyperpyyaml

    monkeypatch.chdir(tmp_path)  # the recipe writes results/ under the working folder
    (tmp_path / "hparams").mkdir()
    shutil.copy(RECIPE, tmp_path / "hparams" / "train_ecapa_tdnn.yaml")
    tuned = cpu_result("ecapa-tdnn", "bf16", 4, accum=2)
    _, argv = bash_words(export(tuned, "speechbrain").command, cwd=tmp_path)
    assert argv[:2] == ["python", "train_speaker_embeddings.py"]
    # SpeechBrain's own parser, as the recipe script calls it; one epoch instead of the recipe's ten (test only).
    hparams_file, run_opts, overrides = sb.parse_arguments([*argv[2:], "--number_of_epochs", "1"])
    with open(hparams_file) as stream:
        hparams = load_hyperpyyaml(stream, overrides)
    assert hparams["dataloader_options"] == {
        "batch_size": 4,
        "shuffle": True,
        "num_workers": 2,
        "pin_memory": False,
        "prefetch_factor": 3,
        "persistent_workers": True,
        "in_order": False,
        "drop_last": True,
    }  # merged: the recipe's shuffle kept
    assert hparams["num_workers"] == 4  # the recipe's own key, still feeding its noise loaders
    brain = _brain_class()(
        modules=hparams["modules"], opt_class=hparams["opt_class"], hparams=hparams, run_opts=run_opts
    )
    brain.loaders, brain.seen = [], []
    brain.fit(hparams["epoch_counter"], _Dataset(10), train_loader_kwargs=hparams["dataloader_options"])
    loader = brain.loaders[0]
    assert loader_settings(loader) == dict(TUNED, batch_size=4)
    assert brain.precision == "bf16" and brain.grad_accumulation_factor == 2
    assert brain.seen == [(4, True, torch.bfloat16)] * 2  # 10 items: 2 full batches, bf16 autocast
    assert brain.optimizer_step == 1  # two batches accumulated into one step


def test_speechbrain_rejects_fp16_on_a_cpu_as_the_note_says() -> None:
    import speechbrain as sb

    _, run_opts, _ = sb.parse_arguments(["hparams.yaml", "--precision", "fp16", "--device", "cpu"])
    with pytest.raises(ValueError, match="not yet supported on CPU"):
        sb.Brain(modules={"layer": torch.nn.Linear(2, 2)}, run_opts=run_opts)


@pytest.mark.parametrize("implementation", ("default", "fused"))
def test_optimizer_kernel_reaches_the_recipes_opt_class(implementation: str, tmp_path: Path) -> None:
    """--opt_class replaces the recipe's `!name:torch.optim.Adam` with the same arguments plus the tuned flag;
    SpeechBrain's parser and hyperpyyaml make the partial the Brain calls with the modules' parameters."""
    import speechbrain as sb
    from hyperpyyaml import load_hyperpyyaml

    (tmp_path / "hparams").mkdir()
    shutil.copy(RECIPE, tmp_path / "hparams" / "train_ecapa_tdnn.yaml")
    _, argv = bash_words(_export(optimizer_impl=implementation).command, cwd=tmp_path)
    assert ("--opt_class" in argv) == (implementation != "default")
    hparams_file, _, overrides = sb.parse_arguments(argv[2:])
    with open(tmp_path / hparams_file) as stream:
        hparams = load_hyperpyyaml(stream, overrides)
    partial = hparams["opt_class"]
    recipe = {"lr": hparams["lr"], "weight_decay": 0.000002}  # train_ecapa_tdnn.yaml's opt_class arguments
    assert partial.func is torch.optim.Adam
    assert partial.keywords == (recipe if implementation == "default" else {**recipe, implementation: True})
    optimizer = partial(torch.nn.Linear(4, 2).parameters())
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)


@pytest.mark.parametrize("in_order", (True, False))
def test_unordered_workers_reach_the_dataloader_options(in_order: bool, tmp_path: Path) -> None:
    """--dataloader_options carries in_order=False, read by SpeechBrain's parser and hyperpyyaml."""
    import speechbrain as sb
    from hyperpyyaml import load_hyperpyyaml

    (tmp_path / "hparams").mkdir()
    shutil.copy(RECIPE, tmp_path / "hparams" / "train_ecapa_tdnn.yaml")
    result = _export(in_order=in_order)
    _, argv = bash_words(result.command, cwd=tmp_path)
    hparams_file, _, overrides = sb.parse_arguments(argv[2:])
    with open(tmp_path / hparams_file) as stream:
        hparams = load_hyperpyyaml(stream, overrides)
    assert hparams["dataloader_options"].get("in_order", True) is in_order
    assert ("not see the batches in the same order" in notes_text(result)) == (not in_order)


def test_checkpointing_cannot_reach_speechbrains_ecapa() -> None:
    import inspect

    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    assert not [name for name in inspect.signature(ECAPA_TDNN).parameters if "checkpoint" in name]
    assert "activation_checkpointing" not in notes_text(_export())  # unset: never searched for ECAPA
    assert "SpeechBrain (its ECAPA_TDNN has no checkpointing option)" in notes_text(
        _export(activation_checkpointing=True)
    )


@pytest.mark.parametrize("mode", ("off", "default", "dynamic"))
def test_compile_reaches_brains_torch_compile_call(mode: str, tmp_path: Path, monkeypatch) -> None:
    """--compile [--compile_using_dynamic_shape_tracing], read by SpeechBrain's own parser into run_opts, make Brain
    call torch.compile on every module (speechbrain/core.py Brain._compile) with the tuned dynamic setting."""
    import speechbrain as sb

    _, argv = bash_words(_export(compile=mode).command, cwd=tmp_path)
    assert ("--compile" in argv) == (mode != "off")
    _, run_opts, _ = sb.parse_arguments(argv[2:])
    calls: list[dict[str, Any]] = []

    def recording_compile(module: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        calls.append(kwargs)
        return module

    monkeypatch.setattr(torch, "compile", recording_compile)
    modules = {"embedding_model": torch.nn.Linear(4, 3), "classifier": torch.nn.Linear(3, 2)}
    brain = sb.Brain(modules=modules, run_opts={**run_opts, "device": "cpu"})
    brain._compile()
    if mode == "off":
        assert calls == []
        return
    assert len(calls) == 2  # every module of the recipe's `modules`, as the note says
    assert {call["dynamic"] for call in calls} == {mode == "dynamic"}
    assert {call["mode"] for call in calls} == {"default"}
    notes = notes_text(_export(compile=mode))
    assert ("dynamic=False" in notes) == (mode == "default")


def test_dynamic_batch_sampler_sizes_buckets_by_one_budget_only() -> None:
    """What docs/exports.md says of bucket batches in SpeechBrain, checked in its own sampler: DynamicBatchSampler
    takes our bucket boundaries (upper bounds there: length <= boundary) but gives each bucket max_batch_length /
    its boundary items, one padded-length budget for all (bucket_scaling 1 measured at the boundary); a per-bucket
    batch size beyond that (bucket_scaling above 1) has no SpeechBrain form."""
    from speechbrain.dataio.sampler import DynamicBatchSampler

    from autotune.data.buckets import bucket_of, plan_buckets

    frames = [100 + (37 * i) % 1400 for i in range(200)]
    plan = plan_buckets(frames, num_buckets=4, max_frames_in_batch=12000, scaling=1.0)
    upper = [boundary - 1 for boundary in plan.boundaries] + [max(frames)]
    sampler = DynamicBatchSampler(
        frames, max_batch_length=12000, bucket_boundaries=upper, lengths_list=frames, shuffle=False
    )
    # one bucket per boundary, plus SpeechBrain's own overflow bucket above the last (empty here)
    assert sampler._bucket_lens[: len(upper)] == [int(12000 / bound) for bound in upper]
    batches = list(sampler)
    assert all(len({bucket_of(frames[i], plan.boundaries) for i in batch}) == 1 for batch in batches)
    assert sorted(i for batch in batches for i in batch) == list(range(200))


# --- the CommonVoice wav2vec2 CTC recipe ---------------------------------------------------------------------------

WAV2VEC2_RECIPE = RECIPES / "speechbrain_train_fr_with_wav2vec.yaml"  # speechbrain/speechbrain 9c826ef, recorded
# A stand-in for the recipe's wav2vec2 (LeBenchmark/wav2vec2-FR-7K-large, fetched from the hub when built), written
# into the test's copy of the recipe (hyperpyyaml builds the recipe's own entry even when an override replaces it).
_STAND_IN = "wav2vec2: !new:torch.nn.Linear\n    in_features: 4\n    out_features: 4\n\n"


def _wav2vec2_hparams(argv: list[str], tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hparams, run_opts) as the recipe script makes them: SpeechBrain's parser, then hyperpyyaml on the recipe."""
    import speechbrain as sb
    from hyperpyyaml import load_hyperpyyaml

    assert argv[:3] == ["python", "train_with_wav2vec.py", "hparams/train_fr_with_wav2vec.yaml"]
    (tmp_path / "hparams").mkdir(exist_ok=True)
    recipe, replaced = re.subn(r"(?ms)^wav2vec2: !new:.*?\n\n", _STAND_IN, WAV2VEC2_RECIPE.read_text())
    assert replaced == 1
    (tmp_path / "hparams" / "train_fr_with_wav2vec.yaml").write_text(recipe)
    hparams_file, run_opts, overrides = sb.parse_arguments(argv[2:])
    with open(tmp_path / hparams_file) as stream:
        return load_hyperpyyaml(stream, overrides), run_opts


@pytest.mark.parametrize(
    ("precision", "environment"),
    [
        ("fp32", {"SB_DISABLE_QUIRKS": "allow_tf32", "NVIDIA_TF32_OVERRIDE": "0"}),
        ("fp32-default", {"SB_DISABLE_QUIRKS": "allow_tf32"}),  # SpeechBrain 1.0.0-1.0.1's fp32 (speechbrain#2531)
        ("tf32", {}),
        ("bf16", {}),
    ],
)
def test_wav2vec2_ctc_precision_and_tf32_quirk(precision: str, environment: dict[str, str]) -> None:
    assigned, argv = bash_words(_export(model="wav2vec2-ctc", precision=precision).command)
    assert assigned == environment
    assert ("--precision" in argv) == (precision == "bf16")


@pytest.mark.slow
def test_wav2vec2_ctc_command_is_read_by_speechbrain_into_the_recipe(tmp_path: Path, monkeypatch) -> None:
    """The recipe's yaml with the command's overrides, as SpeechBrain and hyperpyyaml read them: the loader options
    merged (no drop_last: the recipe keeps its last batch; the script turns shuffle off itself for sorting:
    ascending), the run options, and both optimizers with the tuned flag where the class takes it."""
    monkeypatch.chdir(tmp_path)  # the recipe's checkpointer and logger write under results/
    tuned = make_tuned(
        model="wav2vec2-ctc", precision="bf16", workers=6, accum=2, optimizer_impl="foreach", per_device_batch_size=12
    )
    _, argv = bash_words(export(tuned, "speechbrain").command, cwd=tmp_path)
    hparams, run_opts = _wav2vec2_hparams(argv, tmp_path)
    assert hparams["dataloader_options"] == {
        "batch_size": 12,
        "num_workers": 6,
        "pin_memory": True,
        "prefetch_factor": 4,
        "persistent_workers": True,
    }
    assert hparams["test_dataloader_options"] == {"batch_size": 4, "num_workers": 6}  # untouched
    assert run_opts["precision"] == "bf16" and run_opts["grad_accumulation_factor"] == 2
    assert hparams["sorting"] == "ascending" and hparams["batch_size"] == 12  # the recipe's own keys, unchanged
    adam, adadelta = hparams["wav2vec_opt_class"], hparams["model_opt_class"]
    assert adam.func is torch.optim.Adam and adam.keywords == {"lr": 0.0001, "foreach": True}
    assert adadelta.func is torch.optim.Adadelta
    assert adadelta.keywords == {"lr": 1.0, "rho": 0.95, "eps": 1e-8, "foreach": True}
    adadelta(torch.nn.Linear(2, 2).parameters())  # the partial builds


@pytest.mark.slow
def test_wav2vec2_ctc_fused_reaches_adam_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _export(model="wav2vec2-ctc", optimizer_impl="fused", device_type="cpu")
    _, argv = bash_words(result.command, cwd=tmp_path)
    hparams, run_opts = _wav2vec2_hparams(argv, tmp_path)
    assert hparams["wav2vec_opt_class"].keywords == {"lr": 0.0001, "fused": True}
    assert hparams["model_opt_class"].keywords == {"lr": 1.0, "rho": 0.95, "eps": 1e-8}  # no fused Adadelta
    assert run_opts["device"] == "cpu" and "fused reaches wav2vec_opt_class (Adam) only" in notes_text(result)


def test_wav2vec2_ctc_notes_name_the_recipe_and_a_reduced_measurement() -> None:
    tuned = make_tuned(model="wav2vec2-ctc")
    notes = notes_text(export(tuned, "speechbrain"))
    assert "recipes/CommonVoice/ASR/CTC" in notes and "test_dataloader_options" in notes and "reduced" not in notes
    reduced = TunedConfig.from_dict(
        tuned.to_dict() | {"workload": {"name": "wav2vec2-ctc", "task": "asr", "options": {"size": "reduced"}}}
    )
    assert "measured the reduced wav2vec2" in notes_text(export(reduced, "speechbrain"))
    assert "--sorting" not in bash_words(export(reduced, "speechbrain").command)[1]  # the recipe's own: not repeated
    changed = {"size": "full", "sorting": "descending", "max_duration_s": 12.0, "wav_augment": False}
    other = TunedConfig.from_dict(
        tuned.to_dict() | {"workload": {"name": "wav2vec2-ctc", "task": "asr", "options": changed}}
    )
    _, argv = bash_words(export(other, "speechbrain").command)
    assert (
        argv[argv.index("--sorting") + 1] == "descending" and argv[argv.index("--avoid_if_longer_than") + 1] == "12.0"
    )
    assert "--lr" not in argv and "remove wav_augment" in notes_text(export(other, "speechbrain"))
