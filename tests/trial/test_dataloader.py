"""One DataLoader builder: the loader a trial measures is built from the kwargs load_config hands to users."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.results import load_config, write_config
from autotune.trial.child import run_trial
from autotune.trial.dataloader import BATCHING_KWARGS, build_loader
from autotune.trial.sampling import CycledEpochs
from autotune.trial.spec import TrialConfig
from tests.test_results import make_tuned
from tests.trial.tiny_setups import faulty_spec, linear_setup

CONFIGS = {
    "no-workers": TrialConfig(per_device_batch_size=4),
    "pinned": TrialConfig(per_device_batch_size=4, pin_memory=True),
    "workers-default-prefetch": TrialConfig(per_device_batch_size=4, num_workers=2),
    "workers": TrialConfig(per_device_batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True),
    "dynamic": TrialConfig(
        per_device_batch_size=4, num_workers=1, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 100}
    ),
}
WORKER_OPTIONS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


def _handed_over(config: TrialConfig, folder: Path) -> dict[str, Any]:
    """What a user gets for this configuration: the result written as YAML, read back with load_config."""
    return load_config(write_config(make_tuned(config), folder / "result.yaml")).dataloader_kwargs()


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_a_trial_loader_is_what_load_config_hands_over(config: TrialConfig, tmp_path: Path) -> None:
    setup = linear_setup(samples=18)
    kwargs = _handed_over(config, tmp_path)
    trial = build_loader(setup, config, total_batches=4, seed=0)
    users = torch.utils.data.DataLoader(setup.dataset, **kwargs)
    # Every option DataLoader resolves (its defaults included) is the same in both loaders.
    assert {name: getattr(trial, name) for name in WORKER_OPTIONS} == {
        name: getattr(users, name) for name in WORKER_OPTIONS
    }
    if kwargs["batch_size"] is None:  # dynamic: the dataset pipeline (in a trial, the workload) forms the batches
        assert "drop_last" not in kwargs
        return
    # The trial's batch sampler batches one epoch as batch_size and drop_last do (18 samples: 4 batches of 4).
    assert isinstance(trial.batch_sampler, CycledEpochs)
    assert [len(batch) for batch in trial.batch_sampler.make_epoch(0)] == [len(batch) for batch in users.batch_sampler]


def test_the_trial_child_measures_with_the_kwargs_load_config_hands_over(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[dict[str, Any]] = []
    real = torch.utils.data.DataLoader

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", Recording)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)  # the trial sets it
    config = TrialConfig(per_device_batch_size=5, num_workers=1, prefetch_factor=3, persistent_workers=True)
    spec = dataclasses.replace(faulty_spec(tmp_path, tiny_corpus, 5), config=config)  # batch 5 trains fine
    Path(spec.result_path).parent.mkdir(parents=True, exist_ok=True)
    result = run_trial(spec)
    assert result.status == "ok", result.reason
    measured = [kwargs for kwargs in built if isinstance(kwargs.get("batch_sampler"), CycledEpochs)]
    assert len(measured) == 1
    used = {key: value for key, value in measured[0].items() if key not in ("batch_sampler", "collate_fn")}
    handed_over = _handed_over(config, tmp_path)
    assert used == {key: value for key, value in handed_over.items() if key not in BATCHING_KWARGS}
    assert {len(batch) for batch in measured[0]["batch_sampler"].make_epoch(0)} == {handed_over["batch_size"]}
