"""Shared fixtures: hardware records without probing, and a tiny real audio corpus."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.machine.gpus import GpuInfo
from autotune.machine.hardware import Hardware
from tests.fixtures.fake_nvml import install_nvml  # noqa: F401 - a fixture for test_hardware and test_gpus

# Test modules that check our code against SpeechBrain's import it into this process, and its allow_tf32 quirk would
# then turn TF32 on for every later test (the doctor reads torch's untouched defaults). Tests of the quirk itself run
# speechbrain in subprocesses with an environment of their own.
os.environ.setdefault("SB_DISABLE_QUIRKS", "allow_tf32")


def make_cpu(cores: int = 2) -> Hardware:
    return Hardware(
        device_type="cpu", cpu_model="Test CPU", cpu_cores=cores, memory_bytes=16 * 2**30, torch_version="x"
    )


def make_cuda(name: str = "NVIDIA A100-SXM4-80GB", capability: tuple[int, int] = (8, 0), count: int = 1) -> Hardware:
    gpus = tuple(
        GpuInfo(name=name, uuid=f"GPU-{index:08d}-aaaa", memory_bytes=80 * 2**30, compute_capability=capability)
        for index in range(count)
    )
    return Hardware(
        device_type="cuda",
        gpus=gpus,
        cpu_model="Test CPU",
        cpu_cores=16,
        memory_bytes=256 * 2**30,
        driver_version="560.35",
        torch_version="x",
        cuda_version="13.0",
    )


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Prepared data (CMVN statistics, TTS targets) of the tests' corpora goes to a session folder, trial
    subprocesses included, never into the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("autotune-cache")
        patch.setenv("AUTOTUNE_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    """A test that sets torch's intra-op threads (as a CPU trial does) leaves the next test the count it found."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _tf32_state(torch: Any, settings: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The legacy allow_tf32 flags and the per-backend fp32_precision values; None where torch refuses to read the
    legacy flags after a mix of both APIs."""
    backends = torch.backends
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the legacy getters' deprecation notice
        try:
            legacy = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32)
        except RuntimeError:
            return None
    return (*legacy, *(setting.fp32_precision for setting in settings))


@pytest.fixture(autouse=True)
def _torch_backend_flags() -> Iterator[None]:
    """A test that sets TF32 and cudnn.benchmark in this process (a trial or the AMP check run in-process, a result's
    apply_backend_flags) leaves the next test torch's flags as it found them (the doctor reads the untouched ones)."""
    import torch

    from autotune.knobs.precision import uses_new_tf32_api

    backends = torch.backends
    settings = (
        (backends.cuda.matmul, backends.cudnn.conv, backends.cudnn.rnn, backends) if uses_new_tf32_api(torch) else ()
    )
    saved, benchmark = _tf32_state(torch, settings), backends.cudnn.benchmark
    yield
    backends.cudnn.benchmark = benchmark
    if saved is None or _tf32_state(torch, settings) == saved:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # The legacy setters first: they reset every cuDNN operator's flag, those the new API does not name too.
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = saved[:2]
    for setting, value in zip(settings, saved[2:], strict=True):
        if setting.fp32_precision != value:
            setting.fp32_precision = value


@pytest.fixture
def cpu_hardware() -> Hardware:
    return make_cpu()


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 speakers x 3 real WAV files of 1-2 s, generated once per test session."""
    from autotune.data.synth import generate_corpus

    return generate_corpus(
        tmp_path_factory.mktemp("corpus") / "tiny",
        n_speakers=4,
        files_per_speaker=3,
        min_duration_s=1.0,
        max_duration_s=2.0,
        seed=1,
    )
