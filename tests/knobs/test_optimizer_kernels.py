"""Optimizer kernels: what this torch and device can run (read from torch, left out of the space with a note), and
parity: the workloads' own optimizers step to the same parameters with each implementation, with and without a
GradScaler, on the CPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from autotune import space
from autotune.errors import SpaceError
from autotune.knobs import optimizer_kernels
from tests.conftest import make_cpu, make_cuda

IMPLEMENTATIONS = optimizer_kernels.IMPLEMENTATIONS


def _without_cpu_fused_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch before 2.4, whose fused SGD/Adam kernels were CUDA's only."""
    from torch.utils import _foreach_utils

    monkeypatch.setattr(_foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])


def test_this_torch_runs_every_implementation_on_the_cpu_and_each_steps() -> None:
    """What the check says runs does run: torch's own SGD and Adam, with the recipes' arguments, step with it."""
    assert optimizer_kernels.offered(list(IMPLEMENTATIONS), "cpu") == list(IMPLEMENTATIONS)
    for implementation in IMPLEMENTATIONS:
        assert optimizer_kernels.unsupported_reason(implementation, "cpu") is None
        for name, recipe in (("SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}), ("Adam", {})):
            parameter = torch.nn.Parameter(torch.ones(4))
            optimizer_class = getattr(torch.optim, name)
            optimizer = optimizer_kernels.build(optimizer_class, [parameter], implementation, lr=0.1, **recipe)
            parameter.grad = torch.ones(4)
            optimizer.step()
            assert parameter.detach().lt(1).all(), (name, implementation)


def test_foreach_is_left_out_on_cuda_where_it_is_torchs_default() -> None:
    assert optimizer_kernels.offered(list(IMPLEMENTATIONS), "cuda") == ["default", "fused"]
    (note,) = optimizer_kernels.left_out(list(IMPLEMENTATIONS), "cuda").values()
    assert note.startswith("optimizer_impl foreach left out") and "by default on cuda" in note
    # A space without `default` keeps foreach: it is then the only way to measure those kernels.
    assert optimizer_kernels.offered(["foreach", "fused"], "cuda") == ["foreach", "fused"]


def test_torchs_own_default_is_what_the_check_assumes() -> None:
    """torch picks foreach where its foreach kernels exist and the for-loop elsewhere (never fused)."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    cpu = [torch.zeros(2)]
    assert _default_to_fused_or_foreach(cpu, differentiable=False, use_fused=False) == (False, False)
    assert not optimizer_kernels.same_kernels("foreach", "cpu") and optimizer_kernels.same_kernels("foreach", "cuda")


def test_a_torch_without_cpu_fused_kernels_leaves_fused_out_with_a_note(monkeypatch) -> None:
    _without_cpu_fused_kernels(monkeypatch)
    reason = optimizer_kernels.unsupported_reason("fused", "cpu")
    assert reason == f"torch {torch.__version__} has no fused optimizer kernels for cpu"
    loaded = space.from_dict(
        {"params": {"per_device_batch_size": {"type": "categorical", "choices": [4]}, **_KERNELS}}, make_cpu(2)
    )
    (param,) = [param for param in loaded.params if param.name == "optimizer_impl"]
    assert list(param.distribution.choices) == ["default", "foreach"]  # type: ignore[attr-defined]
    assert loaded.space_notes == (f"optimizer_impl fused left out of the search: {reason}",)
    assert loaded.baseline["optimizer_impl"] == "default"


def test_a_torch_whose_optimizers_lack_the_argument_leaves_it_out(monkeypatch) -> None:
    class OldAdam(torch.optim.Adam):  # a constructor without fused, as torch.optim.Adam before 1.13
        def __init__(self, params: Any, lr: float = 1e-3) -> None:
            super().__init__(params, lr=lr)

    monkeypatch.setattr(torch.optim, "Adam", OldAdam)
    assert optimizer_kernels.unsupported_reason("fused", "cuda") == (
        f"torch {torch.__version__}'s torch.optim.Adam has no fused argument"
    )
    assert optimizer_kernels.offered(list(IMPLEMENTATIONS), "cuda") == ["default"]


def test_a_fixed_implementation_the_device_cannot_run_is_a_one_line_error(monkeypatch) -> None:
    _without_cpu_fused_kernels(monkeypatch)
    with pytest.raises(SpaceError, match="fixed optimizer_impl 'fused' cannot run here: torch .* no fused") as error:
        space.from_dict({"params": _KERNELS, "fixed": {"optimizer_impl": "fused"}}, make_cpu(2))
    assert "\n" not in str(error.value)
    with pytest.raises(SpaceError, match="unknown optimizer_impl 'apex'"):
        space.from_dict({"params": {"optimizer_impl": {"type": "categorical", "choices": ["apex"]}}}, make_cpu(2))
    # On CUDA a fixed foreach is kept: the user asked for it by name.
    fixed = space.from_dict({"params": _KERNELS, "fixed": {"optimizer_impl": "foreach"}}, make_cuda())
    assert fixed.fixed["optimizer_impl"] == "foreach"


_KERNELS = {"optimizer_impl": {"type": "categorical", "choices": list(IMPLEMENTATIONS)}}


# --- parity: the workloads' own optimizers, stepped with each implementation ---------------------------------------
# The three implementations are one algorithm in a different order of float32 operations, so after N steps each
# parameter may differ from `default`'s by rounding: a few ulps of its value, plus a sliver of its own update (Adam's
# sqrt and division round differently when fused). TOLERANCE says how much: far below any update that trains.
STEPS = 4
ULPS = 4
UPDATE_SHARE = 1e-4


def _models() -> dict[str, tuple[torch.nn.Module, Callable[[torch.nn.Module, str], torch.optim.Optimizer]]]:
    """Each workload family's network (narrow where the recipe's is large: the optimizer code is the same) with the
    optimizer its workload builds: 3D-Speaker's SGD (CAM++'s and ERes2Net's), SpeechBrain's Adam, WeNet's and
    ming024's Adam with their learning-rate schedule and clipping in a step pre-hook."""
    from autotune.models.conformer import ConformerASR
    from autotune.models.ecapa_tdnn import ECAPATDNN
    from autotune.models.eres2net import ERes2Net
    from autotune.models.fastspeech2 import FastSpeech2
    from autotune.workloads import asr, tts
    from autotune.workloads.speaker import speaker_optimizer

    torch.manual_seed(0)
    small_conformer = {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2}
    return {
        "eres2net": (
            ERes2Net(m_channels=8),
            lambda model, impl: speaker_optimizer("sgd", 0.2, model.parameters(), impl),
        ),
        "ecapa-tdnn": (
            ECAPATDNN(channels=64, embedding_size=192),
            lambda model, impl: speaker_optimizer("adam", 0.001, model.parameters(), impl),
        ),
        "conformer": (
            ConformerASR(vocab_size=50, **small_conformer, decoder_blocks=1),
            lambda model, impl: asr.recipe_optimizer(model, impl),
        ),
        "fastspeech2": (
            FastSpeech2(d_model=32, encoder_layers=1, decoder_layers=1, conv_filter_size=64, variance_filter_size=32),
            lambda model, impl: tts.recipe_optimizer(model, 32, impl),
        ),
    }


def _gradients(model: torch.nn.Module, step: int) -> list[torch.Tensor]:
    """The same gradients for every implementation: large enough that the recipes' clipping acts."""
    generator = torch.Generator().manual_seed(step)
    return [torch.randn(param.shape, generator=generator) for param in model.parameters()]


def _train(
    model: torch.nn.Module, make: Callable[[torch.nn.Module, str], torch.optim.Optimizer], impl: str, scaler: Any
) -> torch.nn.Module:
    """STEPS optimiser steps from the same start; with a GradScaler the gradients arrive scaled through backward, as
    in a trial's fp16 step (the loss sum(param * gradient) has exactly those gradients)."""
    model = copy.deepcopy(model)
    optimizer = make(model, impl)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        gradients = _gradients(model, step)
        if scaler is None:
            for param, gradient in zip(model.parameters(), gradients, strict=True):
                param.grad = gradient
            optimizer.step()
        else:
            loss = sum((param * gradient).sum() for param, gradient in zip(model.parameters(), gradients, strict=True))
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    return model


@torch.no_grad()
def _assert_parity(start: torch.nn.Module, reference: torch.nn.Module, other: torch.nn.Module, what: str) -> None:
    eps = torch.finfo(torch.float32).eps
    moved = False
    pairs = zip(reference.parameters(), other.parameters(), strict=True)
    for (name, first), (ref, got) in zip(start.named_parameters(), pairs, strict=True):
        update = (ref - first).abs()
        tolerance = ULPS * eps * torch.maximum(ref.abs(), first.abs()) + UPDATE_SHARE * update
        excess = ((got - ref).abs() - tolerance).max()
        assert excess <= 0, f"{what}: {name} differs from default's by more than rounding ({float(excess):.3g} over)"
        moved = moved or bool(update.max() > 1e3 * ULPS * eps * first.abs().max().clamp(min=1e-3))
    assert moved, f"{what}: the parameters barely moved: the comparison proves nothing"


@pytest.mark.slow
def test_every_implementation_steps_the_workloads_optimizers_to_the_same_parameters() -> None:
    for name, (model, make) in _models().items():
        reference = _train(model, make, "default", None)
        for impl in ("foreach", "fused"):
            _assert_parity(model, reference, _train(model, make, impl, None), f"{name} {impl}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ("conformer", "fastspeech2"))
def test_fused_under_a_grad_scaler_clips_true_gradients(name: str, monkeypatch) -> None:
    """A GradScaler hands a fused optimizer the scale instead of unscaling; the recipes clip in a step pre-hook, so the
    hook unscales first (workloads/common.unscale_for_clipping). Same parameters as the for-loop under the same scaler
    (a CPU GradScaler: the same code path as CUDA's); without the unscaling they are not."""
    model, make = _models()[name]
    reference = _train(model, make, "default", torch.amp.GradScaler("cpu", init_scale=2.0**16))
    fused = _train(model, make, "fused", torch.amp.GradScaler("cpu", init_scale=2.0**16))
    _assert_parity(model, reference, fused, f"{name} fused under GradScaler")
    from autotune.workloads import common

    monkeypatch.setattr(common, "unscale_for_clipping", lambda optimizer: None)
    unclipped = _train(model, make, "fused", torch.amp.GradScaler("cpu", init_scale=2.0**16))
    with pytest.raises(AssertionError, match="more than rounding"):
        _assert_parity(model, reference, unclipped, "without unscaling")


def test_unscaling_leaves_an_optimizer_without_a_scale_alone() -> None:
    from autotune.workloads.common import unscale_for_clipping

    parameter = torch.nn.Parameter(torch.ones(2))
    parameter.grad = torch.full((2,), 8.0)
    optimizer = torch.optim.Adam([parameter], fused=True)
    unscale_for_clipping(optimizer)  # no GradScaler: nothing to undo
    assert parameter.grad.tolist() == [8.0, 8.0]
    optimizer.grad_scale = torch.tensor(4.0)  # type: ignore[attr-defined]  # as GradScaler.step sets it
    unscale_for_clipping(optimizer)
    assert parameter.grad.tolist() == [2.0, 2.0] and optimizer.grad_scale is None  # type: ignore[attr-defined]


# --- a real run: each implementation trained in its own trial, shown in the trial table and the result ------------


@pytest.mark.slow
def test_a_real_run_measures_each_implementation_and_the_result_names_the_winners(tmp_path, tiny_corpus) -> None:
    from autotune import load_config
    from autotune.result import report
    from autotune.run import runner
    from tests.fixtures.runs import cam_grid_request

    space = (
        "params:\n  optimizer_impl: {type: categorical, choices: [default, foreach, fused]}\n"
        "fixed: {per_device_batch_size: 4, num_workers: 0, precision: fp32, intra_op_threads: 1}\n"
    )
    request = cam_grid_request(tmp_path, tiny_corpus, space, trials=4)
    run = runner.execute(runner.prepare(request))  # the baseline, then the grid's three points (default again)
    measured = {record.config.optimizer_impl: record for record in run.outcome.records if record.role != "preload"}
    assert set(measured) == {"default", "foreach", "fused"}
    assert all(record.result.status == "ok" for record in run.outcome.records), run.outcome.records
    assert run.outcome.records[0].role == "baseline"  # the recipe's optimizer, as built
    assert run.outcome.records[0].config.optimizer_impl == "default"
    tuned = load_config(run.result_path)
    written = yaml.safe_load(Path(run.result_path).read_text())
    assert written["optimizer"] == {
        "implementation": tuned.config.optimizer_impl,
        "torch_kwargs": tuned.optimizer_kwargs(),
    }
    assert tuned.config.optimizer_impl == run.outcome.winner.config.optimizer_impl  # type: ignore[union-attr]
    frame = report.trials_frame(report.load_study(tuned, None))
    assert str(frame["optimizer_impl"].dtype) == "string"
    assert set(frame["optimizer_impl"].dropna()) == {"default", "foreach", "fused"}
    lines = {record.config.short() for record in measured.values()}
    assert lines == {"bs=4 w=0 fp32 thr=1", "bs=4 w=0 fp32 foreach thr=1", "bs=4 w=0 fp32 fused thr=1"}
