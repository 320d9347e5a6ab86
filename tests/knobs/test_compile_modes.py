"""The compile knob's modes: what torch.compile takes for each, where inductor runs (read from this torch and
machine, left out of the space with a note where it cannot), and which modules a workload's model compiles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune import space
from autotune.errors import SpaceError
from autotune.knobs import compile_modes
from tests.conftest import make_cpu, make_cuda
from tests.fixtures.inductor import NEEDS_INDUCTOR

_COMPILE = {"compile": {"type": "categorical", "choices": list(compile_modes.MODES)}}
_BATCH = {"per_device_batch_size": {"type": "categorical", "choices": [4]}}


def test_each_mode_is_the_torch_compile_call_it_names() -> None:
    assert compile_modes.compile_kwargs("default") == {}
    assert compile_modes.compile_kwargs("dynamic") == {"dynamic": True}
    with pytest.raises(ValueError, match="nothing is compiled"):
        compile_modes.compile_kwargs("off")
    with pytest.raises(ValueError, match="not one of off, default, dynamic"):
        compile_modes.compile_kwargs("max-autotune")  # not offered: it crashes under DDP and autotunes for minutes


@NEEDS_INDUCTOR  # where this torch compiles at all (on torch 2.4-2.8 nothing is offered)
def test_this_machine_runs_inductor_on_its_cpu() -> None:
    """gcc/g++ are installed here (and in CI), so every mode is offered on the CPU."""
    assert compile_modes.unsupported_reason("default", "cpu") is None
    assert compile_modes.offered(list(compile_modes.MODES), "cpu") == list(compile_modes.MODES)


def test_the_cpu_compiler_is_inductors_own_found_on_path(monkeypatch) -> None:
    from torch._inductor import config

    found = compile_modes._cpu_compiler()
    configured = config.cpp.cxx if isinstance(config.cpp.cxx, tuple) else (config.cpp.cxx,)
    assert found is not None and found in configured  # g++ here (torch's default list)
    monkeypatch.setattr(compile_modes.shutil, "which", lambda name: None)  # not inductor's config: a process global
    assert compile_modes._cpu_compiler() is None


@NEEDS_INDUCTOR
def test_a_cpu_without_a_cxx_compiler_leaves_compiling_out_with_a_note(monkeypatch) -> None:
    monkeypatch.setattr(compile_modes.shutil, "which", lambda name: None)
    reason = compile_modes.unsupported_reason("dynamic", "cpu")
    assert reason is not None and "C++ compiler" in reason
    loaded = space.from_dict({"params": {**_BATCH, **_COMPILE}}, make_cpu(2))
    (param,) = [param for param in loaded.params if param.name == "compile"]
    assert list(param.distribution.choices) == ["off"]  # type: ignore[attr-defined]
    assert loaded.space_notes == (
        f"compile default left out of the search: {reason}",
        f"compile dynamic left out of the search: {reason}",
    )
    assert compile_modes.unsupported_reason("off", "cpu") is None  # eager needs no compiler


@NEEDS_INDUCTOR
def test_cuda_without_triton_leaves_compiling_out(monkeypatch) -> None:
    monkeypatch.setattr(compile_modes, "_has_triton", lambda: False)
    assert "Triton" in (compile_modes.unsupported_reason("default", "cuda") or "")
    loaded = space.from_dict({"params": {**_BATCH, **_COMPILE}}, make_cuda())
    assert len(loaded.space_notes) == 2 and all("needs Triton on CUDA" in note for note in loaded.space_notes)


@NEEDS_INDUCTOR
def test_a_fixed_mode_the_machine_cannot_run_is_a_one_line_error(monkeypatch) -> None:
    monkeypatch.setattr(compile_modes, "_cpu_compiler", lambda: None)
    with pytest.raises(SpaceError, match="fixed compile 'default' cannot run here: inductor needs a C") as error:
        space.from_dict({"params": _BATCH, "fixed": {"compile": "default"}}, make_cpu(2))
    assert "\n" not in str(error.value)


@NEEDS_INDUCTOR
def test_a_torch_whose_module_compile_compiles_nothing_leaves_compiling_out(monkeypatch) -> None:
    """torch 2.4-2.8 (Python 3.10.13, CPU): nn.Module.compile left the module eager, so every compiled trial measured
    eager training under a compile label. Probed for real: here with a Module.compile that does nothing, as there."""
    assert compile_modes._module_compile_engages()  # this torch (2.9+) compiles through Module.compile
    monkeypatch.setattr(nn.Module, "compile", lambda self, *args, **kwargs: None)
    compile_modes._module_compile_engages.cache_clear()
    try:
        reason = compile_modes.unsupported_reason("default", "cpu")
        assert reason is not None and "nn.Module.compile compiles nothing here" in reason
        loaded = space.from_dict({"params": {**_BATCH, **_COMPILE}}, make_cpu(2))
        (param,) = [param for param in loaded.params if param.name == "compile"]
        assert list(param.distribution.choices) == ["off"]  # type: ignore[attr-defined]
    finally:
        monkeypatch.undo()
        compile_modes._module_compile_engages.cache_clear()
    assert compile_modes._module_compile_engages()


def test_a_python_dynamo_does_not_support_leaves_compiling_out(monkeypatch) -> None:
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    assert "does not support this Python" in (compile_modes.unsupported_reason("default", "cpu") or "")


def test_the_network_modules_are_compiled_in_place_not_the_container() -> None:
    """A ModuleDict (the speaker workloads' embedder, classifier and margin loss) has no forward of its own: each
    entry is compiled; parameters and state-dict keys stay what the optimiser and a checkpoint know."""
    model = nn.ModuleDict({"embedder": nn.Linear(4, 3), "classifier": nn.Linear(3, 2)})
    keys, parameters = list(model.state_dict()), list(model.parameters())
    assert compile_modes.apply(model, "off") == 0
    assert compile_modes.apply(model, "dynamic") == 2
    assert list(model.state_dict()) == keys and list(model.parameters()) == parameters
    assert all(module._compiled_call_impl is not None for module in model.children())
    plain = nn.Linear(2, 2)
    assert compile_modes.compiled_modules(plain) == [plain]
    assert torch.nn.Module.compile is not None  # the in-place API the trial relies on (torch 2.2+)
