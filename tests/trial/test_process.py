"""One process and model setup: trials, the AMP check and load_config set threads, flags and weights alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from autotune.knobs.config import TrialConfig
from autotune.knobs.process import apply_process_settings
from autotune.result.tuned_config import TunedConfig
from autotune.trial.amp_curves import AmpCheckSettings, CurveRunner
from autotune.trial.process import TrialProcess
from tests.result.test_results import make_tuned
from tests.trial.tiny_setups import faulty_spec


def test_a_seeded_build_gives_the_same_initial_weights_on_the_device_in_train_mode(tmp_path: Path, tiny_corpus: Path):
    spec = faulty_spec(tmp_path, tiny_corpus, 5)
    process = TrialProcess.open(spec)
    assert process.device == torch.device("cpu") and process.seed == spec.seed
    first, second = process.build(spec.config), process.build(spec.config)
    assert first.model is not second.model and first.model.training
    weights = zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in weights)


def test_the_amp_check_trains_from_the_weights_a_trial_starts_from(tmp_path: Path, tiny_corpus: Path):
    spec = faulty_spec(tmp_path, tiny_corpus, 5)
    settings = AmpCheckSettings(batch_size=5, batches=1)
    runner = CurveRunner(spec, settings)
    trial = TrialProcess.open(spec).build(dataclasses.replace(spec.config, num_workers=0))
    assert runner.initial.keys() == trial.model.state_dict().keys()
    assert all(torch.equal(runner.initial[name], value) for name, value in trial.model.state_dict().items())


def test_load_config_applies_the_threads_and_flags_a_trial_applies() -> None:
    config = TrialConfig(per_device_batch_size=4, intra_op_threads=1, precision="fp32")
    tuned: TunedConfig = make_tuned(config)
    before, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    try:
        torch.set_num_threads(2)
        trial_api = apply_process_settings(config, tuned.precision)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert tuned.apply_backend_flags() == trial_api and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        torch.backends.cudnn.benchmark = benchmark
