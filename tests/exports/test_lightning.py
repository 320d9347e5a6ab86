"""Lightning: the Trainer and DataLoader snippet, and the snippet exec'd as printed and trained by Trainer.fit."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

from autotune.data.buckets import BucketPlan
from autotune.exports import export
from tests.exports.common import TUNED, bucket_tuned, call_kwargs, cpu_result, loader_settings, make_tuned, notes_text
from tests.fixtures.inductor import NEEDS_INDUCTOR


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("fp32", "32-true"),
        ("fp32-default", "32-true"),
        ("tf32", "32-true"),
        ("bf16", "bf16-mixed"),
        ("fp16", "16-mixed"),
    ],
)
@pytest.mark.parametrize("world_size", (1, 4), ids=("ws1", "ws4"))
def test_trainer(precision: str, expected: str, world_size: int) -> None:
    result = export(make_tuned(precision=precision, world_size=world_size, accum=2), "lightning")
    assert result.yaml_text is None and result.python_text is not None
    trainer = call_kwargs(result.python_text, "Trainer")
    assert trainer["precision"] == expected
    assert trainer["devices"] == world_size and trainer["accumulate_grad_batches"] == 2
    assert trainer["accelerator"] == "gpu" and trainer["benchmark"] is True
    assert trainer.get("strategy") == ("ddp" if world_size > 1 else None)
    text = result.python_text
    assert ("torch.backends.cuda.matmul.allow_tf32 = False" in text) == (precision == "fp32")
    assert ("torch.backends.cuda.matmul.allow_tf32 = True" in text) == (precision == "tf32")
    if precision == "fp32-default":
        assert "allow_tf32" not in text and "with no TF32 flag set" in notes_text(result)


@pytest.mark.parametrize("workers", (0, 4), ids=("w0", "w4"))
def test_dataloader(workers: int) -> None:
    python_text = export(make_tuned(workers=workers, world_size=4), "lightning").python_text
    assert python_text is not None
    loader = call_kwargs(python_text, "DataLoader")
    assert loader["batch_size"] == 32 and loader["num_workers"] == workers and loader["pin_memory"] is True
    assert loader["drop_last"] is True and loader["shuffle"] is True
    assert ("prefetch_factor" in loader) == ("persistent_workers" in loader) == (workers > 0)


def test_dynamic_batching_emits_the_batch_sampler() -> None:
    """The loader under dynamic batching has its batch_sampler (before: no batch_size, so batches of 1)."""
    result = export(make_tuned(model="conformer", dynamic=True, world_size=2), "lightning")
    text = result.python_text or ""
    loader = call_kwargs(text, "DataLoader")
    assert loader == {
        "batch_sampler": "batch_sampler",
        "collate_fn": "collate_fn",  # the user's padding collate: torch's default cannot stack variable-length items
        "num_workers": 4,
        "pin_memory": True,
        "prefetch_factor": 4,
        "persistent_workers": True,
    }
    sampler = call_kwargs(text, "LengthSortedBatchSampler")
    assert sampler["max_frames_in_batch"] == 12000 and sampler["num_batches"] is None
    assert call_kwargs(text, "Trainer")["use_distributed_sampler"] is False
    assert "batch_size" not in loader and "shuffle" not in loader and "drop_last" not in loader


def test_fp16_on_a_cpu_says_lightning_switches_to_bf16() -> None:
    """Lightning warns and trains bf16-mixed (Lightning #16783); the old note said it rejects fp16 (wrong)."""
    notes = notes_text(export(make_tuned(precision="fp16", device_type="cpu"), "lightning"))
    assert "warns and trains" in notes and "bf16-mixed" in notes and "rejects" not in notes


# --- the snippet, exec'd as printed, trained by Lightning's own Trainer ----------------------------------------------


class _Probe:
    """What the LightningModule saw inside training_step."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.autocast: list[tuple[bool, torch.dtype]] = []


def _module(
    probe: _Probe, optimizer_kwargs: dict[str, Any] | None = None, compile_kwargs: dict[str, Any] | None = None
) -> Any:
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 4)
            if compile_kwargs is not None:  # what the compile note tells users to write in __init__
                self.layer.compile(**compile_kwargs)

        def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
            features, labels = batch
            probe.batch_sizes.append(int(labels.shape[0]))
            probe.autocast.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            return torch.nn.functional.cross_entropy(self.layer(features), labels)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, **(optimizer_kwargs or {}))

    return Tiny()


def _fit(python_text: str, namespace: dict[str, Any], probe: _Probe) -> Any:
    exec(compile(ast.parse(python_text), "<autotune export>", "exec"), namespace)  # exactly as printed
    trainer = namespace["trainer"]
    trainer.fit_loop.max_epochs = 1
    module = _module(probe, namespace.get("optimizer_kwargs"), namespace.get("compile_kwargs"))
    trainer.fit(module, namespace["train_loader"])
    return trainer


def _dataset(count: int) -> torch.utils.data.Dataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(count, 8, generator=generator), torch.arange(count) % 4)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ("bf16", "fp16", "fp32-default"))
def test_snippet_trains_with_the_tuned_values(precision: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # Lightning writes its logs and checkpoints into the working folder
    tuned = cpu_result("cam++", precision, 6, intra_op_threads=1)
    probe = _Probe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(export(tuned, "lightning").python_text or "", {"train_dataset": _dataset(20)}, probe)
    loader = trainer.train_dataloader
    assert loader_settings(loader) == dict(TUNED, batch_size=6)
    assert probe.batch_sizes == [6, 6, 6]  # 20 items, the short last batch dropped
    amp = {"bf16": torch.bfloat16, "fp16": torch.bfloat16}.get(precision)
    assert set(probe.autocast) == ({(True, amp)} if amp else {(False, torch.bfloat16)})
    if precision == "fp16":  # what the note says: a warning, then bf16-mixed on the CPU
        assert trainer.precision == "bf16-mixed"
        assert any("bf16-mixed" in str(warning.message) for warning in caught)
    assert torch.get_num_threads() == 1


FRAMES = [100, 200, 100, 300, 50, 150, 250, 100, 200, 400]  # each item's frames, for the dynamic batch sampler


def _dynamic_cpu_result(workers: int) -> Any:
    """A conformer result with WeNet's dynamic batches (400 frames per batch), measured on the CPU."""
    return make_tuned(
        model="conformer",
        dynamic=True,
        precision="fp32-default",
        device_type="cpu",
        workers=workers,
        pin_memory=False,
        workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 400},
    )


@pytest.mark.slow
def test_dynamic_snippet_trains_with_its_batch_sampler(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    tuned = _dynamic_cpu_result(workers=1)
    frames = FRAMES
    probe = _Probe()
    namespace = {"train_dataset": _dataset(len(frames)), "train_frames": frames, "collate_fn": default_collate}
    trainer = _fit(export(tuned, "lightning").python_text or "", namespace, probe)
    loader = trainer.train_dataloader
    assert loader.batch_size is None and loader.num_workers == 1
    assert sum(probe.batch_sizes) == len(frames) and max(probe.batch_sizes) > 1  # every item once, real batches
    batches = list(namespace["batch_sampler"])
    assert all(max(frames[i] for i in batch) * len(batch) <= 400 or len(batch) == 1 for batch in batches)


class _VariableLength(torch.utils.data.Dataset):
    """Items of different lengths (frames x 8), as speech is: torch's default collate cannot stack them."""

    def __init__(self, frames: list[int]) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = [
            (torch.randn(count // 10, 8, generator=generator), index % 4) for index, count in enumerate(frames)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.items[index]


def _pad_collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A padding collate, as a speech recipe has one: pad to the longest, then pool over time for the tiny model."""
    padded = torch.nn.utils.rnn.pad_sequence([features for features, _ in items], batch_first=True)
    return padded.mean(dim=1), torch.tensor([label for _, label in items])


@pytest.mark.slow
def test_dynamic_snippet_trains_variable_length_items_with_the_users_padding_collate(tmp_path, monkeypatch) -> None:
    """Pasted over a loader of variable-length audio, the snippet keeps the loader's padding collate: without it the
    first batch fails to stack ("stack expects each tensor to be equal size")."""
    monkeypatch.chdir(tmp_path)
    tuned = _dynamic_cpu_result(workers=0)
    frames = FRAMES
    probe = _Probe()
    namespace = {"train_dataset": _VariableLength(frames), "train_frames": frames, "collate_fn": _pad_collate}
    _fit(export(tuned, "lightning").python_text or "", namespace, probe)
    assert sum(probe.batch_sizes) == len(frames) and max(probe.batch_sizes) > 1


def test_bucket_batching_emits_autotunes_bucket_sampler() -> None:
    plan = BucketPlan(boundaries=(150, 250), batch_sizes=(6, 3, 2))
    text = export(bucket_tuned(plan, world_size=2), "lightning").python_text or ""
    sampler = call_kwargs(text, "BucketBatchSampler")
    assert sampler["rank"] == "trainer.global_rank" and sampler["world_size"] == "trainer.world_size"
    assert "BucketPlan(boundaries=(150, 250), batch_sizes=(6, 3, 2))" in text
    assert call_kwargs(text, "Trainer")["use_distributed_sampler"] is False
    assert call_kwargs(text, "DataLoader")["batch_sampler"] == "batch_sampler"


@pytest.mark.slow
def test_bucket_snippet_trains_each_item_once_per_epoch_reshuffled(tmp_path: Path, monkeypatch) -> None:
    """Lightning's fit over two epochs with the snippet's sampler: every item once per epoch in bucket batches, and
    the second epoch shuffled anew (Lightning calls set_epoch only on a batch sampler's inner sampler)."""
    monkeypatch.chdir(tmp_path)
    plan = BucketPlan(boundaries=(150, 250), batch_sizes=(4, 2, 1))
    tuned = bucket_tuned(plan, precision="fp32-default", device_type="cpu", workers=0, pin_memory=False)
    frames = [100, 200, 100, 300, 50, 150, 250, 100, 200, 400, 120, 130]
    probe = _Probe()
    namespace: dict[str, Any] = {"train_dataset": _dataset(len(frames)), "train_frames": frames}
    namespace["collate_fn"] = default_collate
    exec(compile(ast.parse(export(tuned, "lightning").python_text or ""), "<autotune export>", "exec"), namespace)
    sampler = namespace["batch_sampler"]
    trainer = namespace["trainer"]
    trainer.fit_loop.max_epochs = 2
    trainer.fit(_module(probe), namespace["train_loader"])
    assert sampler.epoch == 2  # each of Lightning's passes drew its own epoch (the shuffles differ: test_buckets)
    per_epoch = len(probe.batch_sizes) // 2
    for epoch in (probe.batch_sizes[:per_epoch], probe.batch_sizes[per_epoch:]):
        assert sum(epoch) == len(frames) and max(epoch) == 4  # every item once, the short bucket's batch of 4


@pytest.mark.slow
def test_snippet_passes_the_optimizer_kernel_to_configure_optimizers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    tuned = cpu_result("cam++", "fp32-default", 6, optimizer_impl="fused")
    text = export(tuned, "lightning").python_text or ""
    assert "optimizer_kwargs = {'fused': True}" in text
    trainer = _fit(text, {"train_dataset": _dataset(20)}, _Probe())
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["fused"] is True
    assert "optimizer_kwargs" not in (export(cpu_result("cam++", "fp32-default", 6), "lightning").python_text or "")


@pytest.mark.slow
@NEEDS_INDUCTOR
def test_snippet_hands_the_compile_to_the_network_and_lightning_trains_it_compiled(tmp_path: Path, monkeypatch) -> None:
    """compile_kwargs in the snippet, applied as the note says (network.compile in __init__): Lightning's own fit
    trains through the compiled graph (dynamo compiles it: inductor on this CPU)."""
    from torch._dynamo import utils

    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    tuned = cpu_result("cam++", "fp32-default", 6, compile="dynamic")
    export_ = export(tuned, "lightning")
    text = export_.python_text or ""
    assert "compile_kwargs = {'dynamic': True}" in text
    assert any("network module in your LightningModule's __init__" in note for note in export_.notes)
    graphs = utils.counters["stats"]["unique_graphs"]
    trainer = _fit(text, {"train_dataset": _dataset(20)}, _Probe())
    assert trainer.global_step == 3 and utils.counters["stats"]["unique_graphs"] > graphs
    assert "compile_kwargs" not in (export(cpu_result("cam++", "fp32-default", 6), "lightning").python_text or "")


@pytest.mark.parametrize("precision", ("bf16", "fp16", "fp32-default"))
def test_fused_under_mixed_precision_cannot_clip_as_the_note_says(precision: str) -> None:
    """Lightning's MixedPrecision (16-mixed and bf16-mixed) refuses gradient clipping for an optimizer that unscales
    itself; 32-true clips it. The note is given exactly where Lightning refuses."""
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    result = export(make_tuned(model="conformer", precision=precision, optimizer_impl="fused"), "lightning")
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(layer.parameters(), fused=True)
    layer(torch.ones(1, 4)).sum().backward()
    mixed = precision in ("bf16", "fp16")
    plugin = MixedPrecision("bf16-mixed", "cpu") if mixed else Precision()
    if mixed:
        with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
            plugin.clip_gradients(optimizer, clip_val=1.0)
    else:
        plugin.clip_gradients(optimizer, clip_val=1.0)
    assert ("refuses gradient_clip_val" in notes_text(result)) == mixed


def test_feature_placement_note_names_the_hook_only_for_device_features() -> None:
    for placement in (None, "workers"):
        assert "on_after_batch_transfer" not in notes_text(export(make_tuned(feature_device=placement), "lightning"))
    assert "on_after_batch_transfer" in notes_text(export(make_tuned(feature_device="device"), "lightning"))


@pytest.mark.slow
def test_device_features_run_in_lightnings_batch_transfer_hook_as_the_note_says(tmp_path: Path, monkeypatch) -> None:
    """The note's recipe, run by Lightning's own Trainer: the dataset yields crops, on_after_batch_transfer turns each
    batch into fbank once it is on the device (outside autocast) and training_step gets the features."""
    import lightning.pytorch as pl

    from autotune.data.features import batched_fbank

    monkeypatch.chdir(tmp_path)
    tuned = cpu_result("cam++", "bf16", 4, feature_device="device")
    namespace: dict[str, Any] = {
        "train_dataset": torch.utils.data.TensorDataset(torch.randn(8, 8000) * 0.1, torch.arange(8) % 4)
    }
    exec(compile(ast.parse(export(tuned, "lightning").python_text or ""), "<autotune export>", "exec"), namespace)
    seen: list[tuple[tuple[int, ...], bool]] = []

    class Speaker(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(80, 4)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            seen.append((tuple(batch[0].shape), torch.is_autocast_enabled("cpu")))
            return batched_fbank(batch[0]), batch[1]

        def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
            features, labels = batch
            assert features.shape == (4, 48, 80) and features.dtype == torch.float32
            return torch.nn.functional.cross_entropy(self.layer(features.mean(dim=1)), labels)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = namespace["trainer"]
    trainer.fit_loop.max_epochs = 1
    trainer.fit(Speaker(), namespace["train_loader"])
    assert seen == [((4, 8000), False), ((4, 8000), False)]  # crops in, before autocast: fbank stays float32


@pytest.mark.parametrize("in_order", (True, False))
def test_unordered_workers_reach_the_snippets_dataloader(in_order: bool) -> None:
    result = export(make_tuned(in_order=in_order), "lightning")
    loader = call_kwargs(result.python_text or "", "DataLoader")
    assert loader.get("in_order", True) is in_order and ("in_order" in loader) == (not in_order)
    assert ("not see the batches in the same order" in notes_text(result)) == (not in_order)


@pytest.mark.parametrize("checkpointing", (None, True, False))
def test_checkpointing_is_model_code_and_the_note_says_how(checkpointing: bool | None) -> None:
    notes = notes_text(export(make_tuned(activation_checkpointing=checkpointing), "lightning"))
    assert ("memory_efficient=True/False" in notes) == (checkpointing is not None)


def test_the_conformers_feature_placement_note_runs_as_written() -> None:
    """For the conformer the note names the waveform dataset, its collate function and the step's call: each name
    resolves, and the call as written turns a collated waveform batch into padded fbank with SpecAugment."""
    import importlib
    import re

    from autotune.data.asr_features import collate_asr_waveforms

    for placement in (None, "workers"):
        assert "feature_device" not in notes_text(
            export(make_tuned(model="conformer", feature_device=placement), "lightning")
        )
    note = notes_text(export(make_tuned(model="conformer", feature_device="device"), "lightning"))
    assert "on_after_batch_transfer" in note and "featurise=False" in note and "SpeakerlabDataset" not in note
    for name in set(re.findall(r"autotune(?:\.\w+)+", note)):
        module, attribute = name.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), attribute), name
    call = re.search(r"autotune\.data\.asr_features\.device_features\(.*\)\)", note)
    assert call is not None
    items = [(torch.randn(length) * 0.1, torch.tensor([3, 4]), length / 16000) for length in (8000, 4000)]
    batch = collate_asr_waveforms(items)
    import autotune.data.asr
    import autotune.data.asr_features

    feats, lengths = eval(call.group(0), {"autotune": autotune, "batch": batch})  # noqa: S307 - the note's own text
    assert feats.shape == (2, 48, 80) and lengths.tolist() == [48, 23]
