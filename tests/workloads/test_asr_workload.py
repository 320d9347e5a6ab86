"""The conformer ASR workload: data loading, the recipe's optimiser step, batching knobs, and real trial steps."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from autotune import workloads, yamlio
from autotune.data import generate_corpus
from autotune.errors import DataError
from autotune.knobs.config import TrialConfig
from autotune.knobs.dataloader import dataloader_kwargs
from autotune.trial import TimingSettings, TrialSpec, launch
from autotune.trial.loader import build_loader
from autotune.workloads.asr import warmup_lr
from autotune.workloads.base import WorkloadContext
from tests.workloads.short_trial import run_two_steps

# The recipe's architecture at a fraction of its size, so that CPU steps take well under a second; the full model is
# what the workload builds by default (and the contract test trains).
SMALL_MODEL = {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2, "decoder_blocks": 1}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_corpus(
        tmp_path_factory.mktemp("asr") / "corpus",
        n_speakers=2,
        files_per_speaker=3,
        min_duration_s=1.0,
        max_duration_s=1.5,
        seed=2,
    )


@pytest.fixture(scope="module")
def conformer() -> workloads.Workload:
    return workloads.get("conformer")


def _setup(workload: workloads.Workload, corpus: Path, config: TrialConfig) -> workloads.TrainingSetup:
    options = {**workload.options, "model": SMALL_MODEL}
    context = WorkloadContext(
        data=workload.load_data(str(corpus)), config=config, options=options, device=torch.device("cpu")
    )
    return workload.build(context)


def test_registered_with_the_published_size(conformer: workloads.Workload) -> None:
    assert conformer.task == "asr" and set(conformer.knobs) == {
        "batch_type",
        "max_frames_in_batch",
        "num_buckets",
        "bucket_scaling",
    }
    assert conformer.published_parameters == 46_197_266  # with aishell's 4233-character vocabulary
    assert conformer.count_parameters is not None and conformer.count_parameters() == 46_197_266


def test_data_needs_transcripts(conformer: workloads.Workload, corpus: Path, tmp_path: Path) -> None:
    source = conformer.load_data(str(corpus))
    assert len(source.utterances) == 6 and all(u.text for u in source.utterances)
    (tmp_path / "spk").mkdir()
    sf.write(tmp_path / "spk" / "a.wav", np.zeros(8000), 16000)
    with pytest.raises(DataError, match="1 of 1 utterances have no transcript .*data.list") as info:
        conformer.load_data(str(tmp_path))
    assert "\n" not in str(info.value)


def test_static_and_dynamic_batches_follow_the_knobs(conformer: workloads.Workload, corpus: Path) -> None:
    static = TrialConfig(per_device_batch_size=3, workload_knobs={"batch_type": "static"})
    setup = _setup(conformer, corpus, static)
    assert len(setup.dataset) == 6  # type: ignore[arg-type]
    batch = next(iter(build_loader(setup, static, total_batches=2, seed=0)))
    assert batch["feats"].shape[0] == batch["tokens"].shape[0] == 3 and setup.samples_in(batch) == 3
    frames = setup.dataset.max_frames  # type: ignore[attr-defined]
    dynamic = TrialConfig(per_device_batch_size=3, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 400})
    # One epoch over the share it is given (here: items 1, 3, 5, as one rank of two would get them).
    sampler = setup.batch_sampler_factory(dynamic, torch.Generator().manual_seed(0), [1, 3, 5])  # type: ignore[misc]
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == [1, 3, 5]
    assert all(max(frames[i] for i in b) * len(b) <= 400 for b in batches)
    unknown = TrialConfig(per_device_batch_size=1, workload_knobs={"batch_type": "bucketed"})
    with pytest.raises(ValueError, match="batch_type"):
        setup.batch_sampler_factory(unknown, torch.Generator(), [0])  # type: ignore[misc]


def test_bucket_batches_and_their_worst_case(conformer: workloads.Workload, corpus: Path) -> None:
    knobs = {"batch_type": "bucket", "max_frames_in_batch": 600, "num_buckets": 3, "bucket_scaling": 2.0}
    config = TrialConfig(per_device_batch_size=16, workload_knobs=knobs)
    setup = _setup(conformer, corpus, config)
    frames = setup.dataset.max_frames  # type: ignore[attr-defined]
    sampler = setup.batch_sampler_factory(config, torch.Generator().manual_seed(0), [0, 2, 4])  # type: ignore[misc]
    plan = sampler.plan
    # bucket batches are dealt whole from every item (the rank's item share is not used): one rank has them all
    assert sorted(i for b in sampler for i in b) == list(range(len(frames))) and len(plan.batch_sizes) > 1
    worst = setup.worst_case_batches(config)  # type: ignore[misc]
    assert [int(batch["feats"].shape[0]) for batch in worst] == list(reversed(plan.batch_sizes))
    # each bucket's batch is its longest items at the slowest speed: the frames the plan was made from
    assert [int(batch["feat_lengths"].max()) for batch in worst] == list(reversed(plan.longest))
    loader_kwargs = dataloader_kwargs(config)
    assert loader_kwargs["batch_size"] is None and "drop_last" not in loader_kwargs


def test_optimizer_step_warms_up_and_clips(conformer: workloads.Workload, corpus: Path) -> None:
    assert warmup_lr(1) == pytest.approx(0.002 / 25000) and warmup_lr(25000) == pytest.approx(0.002)
    assert warmup_lr(100_000) == pytest.approx(0.001)
    setup = _setup(conformer, corpus, TrialConfig(per_device_batch_size=2))
    for parameter in setup.model.parameters():
        parameter.grad = torch.full_like(parameter, 10.0)
    setup.optimizer.step()
    setup.optimizer.step()
    assert setup.optimizer.param_groups[0]["lr"] == pytest.approx(warmup_lr(2))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in setup.model.parameters()]))
    assert float(norm) == pytest.approx(5.0, rel=1e-4)  # clipped to the recipe's grad_clip


@pytest.mark.parametrize(
    ("workers", "extra"),
    [
        (0, {"batch_type": "static"}),
        (1, {"batch_type": "dynamic", "max_frames_in_batch": 500}),
        (0, {"batch_type": "bucket", "max_frames_in_batch": 500, "num_buckets": 3, "bucket_scaling": 1.5}),
    ],
    ids=["static-in-process", "dynamic-worker", "bucket-in-process"],
)
def test_trains_in_a_trial_subprocess(corpus: Path, tmp_path: Path, workers: int, extra: dict) -> None:
    data_file = yamlio.write_json(tmp_path / "data.json", workloads.get("conformer").load_data(str(corpus)).to_dict())
    spec = TrialSpec(
        workload="conformer",
        workload_options={"model": SMALL_MODEL},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=2, num_workers=workers, workload_knobs=extra),
        timing=TimingSettings(warmup_steps=1, window_s=0.01, min_window_steps=1, max_window_steps=1),  # 2 steps
        device_type="cpu",
        result_path=str(tmp_path / "trial" / "result.json"),
    )
    result = launch(spec, workdir=tmp_path / "trial", timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.all_losses_finite and result.window_steps == 1
    assert result.samples_per_second and result.samples_per_second > 0
    assert result.audio_seconds_per_second and result.audio_seconds_per_second > result.samples_per_second  # >1 s each
    buckets = (result.epoch_accounting or {}).get("buckets")
    if extra["batch_type"] == "bucket":  # the trial reports the buckets it formed, for the result
        assert buckets and len(buckets["bucket_batch_sizes"]) == len(buckets["bucket_boundaries"]) + 1
        assert result.worst_case_batches == len(buckets["bucket_batch_sizes"])  # each bucket probed
    else:
        assert buckets is None


def test_preloads_only_the_kept_utterances_and_reads_them_from_ram(
    conformer: workloads.Workload, corpus: Path, tmp_path: Path
) -> None:
    source = conformer.load_data(str(shutil.copytree(corpus, tmp_path / "corpus")))
    # The filter drops an utterance without tokens: its audio must not be preloaded (the CMVN statistics, computed
    # over the whole list as WeNet's, read it once before preloading; it is deleted with the others below).
    gone = shutil.copy(source.utterances[0].path, tmp_path / "gone.wav")
    dropped = replace(source.utterances[0], utt_id="no-text", path=str(gone), text="")
    config = TrialConfig(per_device_batch_size=2, preload_audio=True)
    context = WorkloadContext(
        data=replace(source, utterances=(*source.utterances, dropped)),
        config=config,
        options={**conformer.options, "model": SMALL_MODEL},
        device=torch.device("cpu"),
    )
    setup = conformer.build(context)
    assert setup.preload_s > 0 and len(setup.dataset.audio) == len(setup.dataset) == 6  # type: ignore[attr-defined]
    for utt in (*source.utterances, dropped):
        Path(utt.path).unlink()
    feats, tokens, _ = setup.dataset[0]  # type: ignore[misc]
    assert feats.shape[1] == 80 and len(tokens) > 0
    assert setup.worst_case_batches is not None  # its copy of the dataset reads from RAM too
    (batch,) = setup.worst_case_batches(config)
    assert setup.samples_in(batch) == 2


def test_the_recipe_baseline_accumulates_four_batches_in_every_configuration(conformer: workloads.Workload) -> None:
    """train_conformer.yaml's accum_grad 4: the baseline and every searched configuration keep it; --global-batch
    replaces it, keeping the recipe's 16 per device where it divides the global batch."""
    from autotune import space
    from tests.conftest import make_cpu, make_cuda

    path = space.space_path(conformer.space_file or "conformer")
    for hardware in (make_cpu(), make_cuda()):
        loaded = space.load(path, hardware, workload_knobs=tuple(conformer.knobs))
        assert loaded.baseline["grad_accum_steps"] == 4 and loaded.fixed["grad_accum_steps"] == 4
        assert loaded.baseline["per_device_batch_size"] == 16
        assert all(seed.get("grad_accum_steps", 4) == 4 for seed in loaded.seeds)
    held = space.load(
        path, make_cuda(count=2), workload_knobs=tuple(conformer.knobs), world_size=2, global_batch_size=128
    )
    assert held.baseline["per_device_batch_size"] == 16  # 16 x 2 GPUs x 4 accumulation steps = 128, as the recipe
    assert any("the recipe's 16 kept" in note and "4 accumulation step(s)" in note for note in held.baseline_notes)


@pytest.mark.slow
def test_a_run_prepares_cmvn_once_before_the_trials_and_reports_it(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    """`autotune run` as a user runs it: the CMVN statistics are computed once before the trials and reported apart
    from the throughput; a fixed grad_accum_steps reaches the baseline (a cheap space: the recipe's is tested above)."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))  # not the statistics other tests prepared
    from typer.testing import CliRunner

    from autotune import load_config
    from autotune.cli import app

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "workload: conformer\n"
        "params: {batch_type: {type: categorical, choices: [static]}, "
        "per_device_batch_size: {type: categorical, choices: [2]}}\n"
        "fixed: {num_workers: 0, grad_accum_steps: 4}\n"
        "baseline: {batch_type: static, per_device_batch_size: 2}\n"
    )
    out = tmp_path / "conformer.yaml"
    quick = ["--window", "0.2", "--warmup-steps", "1", "--device", "cpu", "--no-amp-check", "--no-ceiling"]
    args = ["run", "--model", "conformer", "--data", str(corpus), "--option", f"model={json.dumps(SMALL_MODEL)}"]
    args += ["--space", str(space_file), "--trials", "1", "--confirm", "0", "--max-throughput-cv", "0"]
    args += ["--results-dir", str(tmp_path / "results"), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, *quick], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    tuned = load_config(out)
    prepared = tuned.metrics["data_preparation"]
    assert prepared["what"].startswith("global CMVN statistics") and prepared["items"] == 6 and not prepared["reused"]
    assert any(note.startswith("global CMVN statistics") and "outside their throughput" in note for note in tuned.notes)
    assert tuned.search["baseline_config"]["grad_accum_steps"] == 4 == tuned.config.grad_accum_steps
    assert tuned.metrics["baseline"]["status"] == "ok"


@pytest.mark.parametrize("implementation", ("default", "foreach", "fused"))
def test_builds_wenets_adam_with_the_tuned_optimizer_kernel(
    conformer: workloads.Workload, corpus: Path, implementation: str
) -> None:
    setup = _setup(conformer, corpus, TrialConfig(per_device_batch_size=2, optimizer_impl=implementation))
    optimizer = setup.optimizer
    assert type(optimizer) is torch.optim.Adam and optimizer.param_groups[0]["lr"] == warmup_lr(1)
    assert optimizer.defaults["foreach"] is (True if implementation == "foreach" else None)
    assert optimizer.defaults["fused"] is (True if implementation == "fused" else None)
    assert len(optimizer._optimizer_step_pre_hooks) == 1  # the recipe's warm-up and clipping, whatever the kernel


@pytest.mark.slow
def test_trains_with_the_fused_adam_in_a_trial_subprocess(corpus: Path, tmp_path: Path) -> None:
    data = workloads.get("conformer").load_data(str(corpus))
    config = TrialConfig(per_device_batch_size=2, optimizer_impl="fused")
    result = run_two_steps("conformer", data, {"model": SMALL_MODEL}, config, tmp_path)
    assert result.samples_per_second and result.samples_per_second > 0


@pytest.mark.parametrize(("knob", "checkpointed"), [(None, False), (True, True), (False, False)])
def test_conformer_checkpoints_its_layers_as_the_knob_says(
    conformer: workloads.Workload, corpus: Path, knob: bool | None, checkpointed: bool
) -> None:
    """WeNet's gradient_checkpointing on encoder and decoder; unset, the aishell recipe's own (off)."""
    setup = _setup(conformer, corpus, TrialConfig(per_device_batch_size=2, activation_checkpointing=knob))
    assert setup.model.encoder.gradient_checkpointing is checkpointed
    assert setup.model.decoder.gradient_checkpointing is checkpointed
