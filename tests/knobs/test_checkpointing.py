"""Activation checkpointing: parity (the gradients of a checkpointed step are the plain step's, dropout included),
the switch is live (the checkpointed segments run twice), which workloads take it, and the memory back-off that
trades it for a batch."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune import space, workloads
from autotune.errors import SpaceError
from autotune.knobs import checkpointing
from autotune.models.campplus import CAMPPlus
from autotune.models.conformer import ConformerASR
from autotune.search.seeds import checkpointed_instead
from autotune.space.knob_checks import check_checkpointing
from tests.conftest import make_cpu, make_cuda
from tests.faults.conftest import error_line, invoke


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine torch's default thread pool made one CAM++ step take 20 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL_CONFORMER = {"output_size": 64, "attention_heads": 2, "linear_units": 128, "num_blocks": 2, "decoder_blocks": 2}


def _count_calls(modules: list[nn.Module]) -> list[int]:
    calls = [0]
    for module in modules:
        module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _step(model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """One forward and backward from `seed` (dropout's draws); the gradients by parameter name."""
    torch.manual_seed(seed)
    loss_of(model).backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}


def _assert_same_gradients(plain: dict[str, torch.Tensor], checkpointed: dict[str, torch.Tensor]) -> None:
    assert plain.keys() == checkpointed.keys() and plain
    for name, gradient in plain.items():
        # The recomputation replays the same operations on the same inputs: equal up to float32 rounding.
        torch.testing.assert_close(checkpointed[name], gradient, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.slow
def test_campplus_memory_efficient_gives_the_plain_gradients_and_recomputes_the_bottlenecks() -> None:
    """3D-Speaker's switch, as the knob sets it: the same weights with and without, one training step each."""
    torch.manual_seed(0)
    checkpointed = CAMPPlus(memory_efficient=True).train()
    plain = copy.deepcopy(checkpointed)
    for layer in (module for module in plain.modules() if hasattr(module, "memory_efficient")):
        layer.memory_efficient = False
    features = torch.randn(2, 50, 80)
    bottlenecks = [m.linear1 for m in checkpointed.modules() if hasattr(m, "memory_efficient")]
    calls = _count_calls(bottlenecks)
    _assert_same_gradients(
        _step(plain, lambda m: m(features).square().mean(), 1),
        _step(checkpointed, lambda m: m(features).square().mean(), 1),
    )
    assert calls[0] == 2 * len(bottlenecks)  # each bottleneck run again in backward: checkpointed, not only flagged
    # As in 3D-Speaker: the recomputation updates the bottleneck's BatchNorm running statistics a second time.
    name = "xvector.block1.tdnnd1.nonlinear1.batchnorm.num_batches_tracked"
    assert checkpointed.state_dict()[name] == 2 and plain.state_dict()[name] == 1


def test_conformer_checkpointing_gives_the_plain_gradients_with_dropout_drawing_the_same_masks() -> None:
    torch.manual_seed(0)
    checkpointed = ConformerASR(vocab_size=20, **SMALL_CONFORMER, gradient_checkpointing=True).train()
    plain = copy.deepcopy(checkpointed)
    plain.encoder.gradient_checkpointing = plain.decoder.gradient_checkpointing = False
    feats, feat_lengths = torch.randn(2, 60, 80), torch.tensor([60, 45])
    tokens, token_lengths = torch.tensor([[3, 4, 5, 6], [7, 8, -1, -1]]), torch.tensor([4, 2])

    def loss_of(model: nn.Module) -> torch.Tensor:
        return model(feats, feat_lengths, tokens, token_lengths)["loss"]

    layers = [*checkpointed.encoder.encoders, *checkpointed.decoder.decoders]
    calls = _count_calls(layers)
    reference = _step(plain, loss_of, seed=5)
    _assert_same_gradients(reference, _step(checkpointed, loss_of, seed=5))
    assert calls[0] == 2 * len(layers)  # every encoder and decoder layer recomputed, as WeNet's
    plain.zero_grad()
    other = _step(plain, loss_of, seed=6)  # dropout is live: another seed, other gradients
    assert any(not torch.equal(other[name], reference[name]) for name in reference)
    checkpointed.eval()  # evaluation never checkpoints (WeNet: `and self.training`)
    with torch.no_grad():
        loss_of(checkpointed)
    assert calls[0] == 3 * len(layers)


def test_the_knob_unset_is_the_recipes_own() -> None:
    assert checkpointing.enabled(None, recipe=True) and not checkpointing.enabled(None, recipe=False)
    assert checkpointing.enabled(True, recipe=False) and not checkpointing.enabled(False, recipe=True)


def test_only_workloads_with_their_frameworks_switch_take_it() -> None:
    described = {name: workloads.get(name).checkpointing for name in workloads.names()}
    assert {name for name, how in described.items() if how} == {"cam++", "conformer"}
    assert "memory_efficient" in described["cam++"] and "gradient_checkpointing" in described["conformer"]


@pytest.mark.parametrize("model", ("eres2net", "ecapa-tdnn", "fastspeech2"))
def test_a_space_naming_it_for_another_workload_is_refused_in_one_line(model: str, tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        f"extends: {model}\nparams:\n  activation_checkpointing: {{type: categorical, choices: [false, true]}}\n"
    )
    loaded = space.load(space_file, make_cpu(2), workload_knobs=tuple(workloads.get(model).knobs))
    with pytest.raises(SpaceError, match=f"activation_checkpointing does not apply to {model}"):
        check_checkpointing(loaded, model, workloads.get(model).checkpointing is not None, str(space_file))
    result = invoke(["run", "--model", model, "--space", str(space_file), "--results-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert f"activation_checkpointing does not apply to {model}" in error_line(result.stderr)
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_a_space_searching_it_must_say_the_recipes_value(tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text("extends: cam++\ncuda:\n  baseline: {activation_checkpointing: null}\n")
    loaded = space.load(space_file, make_cuda())
    with pytest.raises(SpaceError, match="its baseline does not say the recipe's value: add it under baseline"):
        check_checkpointing(loaded, "cam++", workloads.get("cam++").checkpointing is not None, str(space_file))


def test_the_builtin_spaces_search_it_on_cuda_from_the_recipes_value() -> None:
    for name, recipe in (("cam++", True), ("conformer", False)):
        knobs = tuple(workloads.get(name).knobs)
        cuda = space.load(space.space_path(name), make_cuda(), workload_knobs=knobs)
        (param,) = [param for param in cuda.params if param.name == checkpointing.KNOB]
        assert set(param.distribution.choices) == {True, False}  # type: ignore[attr-defined]
        assert cuda.baseline[checkpointing.KNOB] is recipe
        assert all(seed[checkpointing.KNOB] is recipe for seed in cuda.seeds)
        cpu = space.load(space.space_path(name), make_cpu(2), workload_knobs=knobs)
        assert checkpointing.KNOB not in {param.name for param in cpu.params} | set(cpu.baseline)


def test_an_out_of_memory_point_without_checkpointing_is_retried_with_it_at_the_same_batch() -> None:
    cam = space.load(space.space_path("cam++"), make_cuda())
    point = {**cam.baseline, "per_device_batch_size": 512, checkpointing.KNOB: False}
    assert checkpointed_instead(cam, point) == {**point, checkpointing.KNOB: True}
    assert checkpointed_instead(cam, {**point, checkpointing.KNOB: True}) is None  # then: halve it
    cpu = space.load(space.space_path("cam++"), make_cpu(2))
    assert checkpointed_instead(cpu, {**cpu.baseline, checkpointing.KNOB: False}) is None  # unsearched


def test_a_seed_that_does_not_fit_trades_recomputation_for_its_batch(tmp_path: Path, monkeypatch) -> None:
    """On a GPU where 512 fits only checkpointed, the tuner's back-off tries the seed checkpointed before halving."""
    from autotune.search.settings import TunerSettings
    from autotune.trial import TrialResult, TrialSpec
    from tests.fixtures.tuners import cam_tuner

    def fake_launch(spec: TrialSpec, **kwargs: Any) -> TrialResult:
        per_sample = 1 if spec.config.activation_checkpointing else 4  # memory per sample, in units of 128 samples
        if spec.config.per_device_batch_size * per_sample > 512:
            return TrialResult(status="oom", reason="CUDA out of memory", wall_s=1.0)
        return TrialResult(status="ok", samples_per_second=float(spec.config.per_device_batch_size), wall_s=10.0)

    monkeypatch.setattr("autotune.search.tuner.launch", fake_launch)
    seeds = ({"per_device_batch_size": 512, "precision": "fp16", checkpointing.KNOB: False},)
    outcome = cam_tuner(
        tmp_path, make_cuda(capability=(7, 0)), TunerSettings(trials=3, confirm_top_k=0), seeds=seeds
    ).run()
    tried = [
        (r.config.per_device_batch_size, r.config.activation_checkpointing, r.result.status) for r in outcome.records
    ]
    assert tried[1:3] == [(512, False, "oom"), (512, True, "ok")]
    assert [r.role for r in outcome.records[:3]] == ["baseline", "seed", "seed"]


@pytest.mark.slow
def test_a_real_run_measures_campplus_with_and_without_checkpointing(tmp_path: Path, tiny_corpus: Path) -> None:
    """A CPU run over the knob (a space of one's own may search it there): each value a real trial subprocess, its
    word in the trial line, its column in the table, the winner's value in the result's memory section."""
    import yaml

    from autotune import load_config
    from autotune.result import report
    from autotune.run import runner
    from tests.fixtures.runs import cam_grid_request

    text = (
        "params:\n  activation_checkpointing: {type: categorical, choices: [true, false]}\n"
        "fixed: {per_device_batch_size: 4, num_workers: 0, precision: fp32, intra_op_threads: 1}\n"
        "baseline: {activation_checkpointing: true}\n"
    )
    run = runner.execute(runner.prepare(cam_grid_request(tmp_path, tiny_corpus, text, trials=3)))
    measured = {record.config.activation_checkpointing: record for record in run.outcome.records}
    assert set(measured) == {True, False}
    assert all(record.result.status == "ok" for record in run.outcome.records), run.outcome.records
    assert run.outcome.records[0].role == "baseline" and run.outcome.records[0].config.activation_checkpointing
    assert {record.config.short() for record in measured.values()} == {
        "bs=4 w=0 fp32 ckpt thr=1",
        "bs=4 w=0 fp32 no-ckpt thr=1",
    }
    assert all(record.result.peak_memory_bytes for record in measured.values())  # the headroom gate's figure
    tuned = load_config(run.result_path)
    written = yaml.safe_load(Path(run.result_path).read_text())
    assert written["memory"] == {"activation_checkpointing": tuned.config.activation_checkpointing}
    assert tuned.config.activation_checkpointing is run.outcome.winner.config.activation_checkpointing  # type: ignore[union-attr]
    frame = report.trials_frame(report.load_study(tuned, None))
    assert str(frame["activation_checkpointing"].dtype) == "boolean"
    assert set(frame["activation_checkpointing"].dropna()) == {True, False}
