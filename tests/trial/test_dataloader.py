"""One DataLoader builder: the loader a trial measures is built from the kwargs load_config hands to users."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune import space
from autotune.errors import SpaceError
from autotune.knobs.config import TrialConfig
from autotune.knobs.dataloader import BATCHING_KWARGS, UNORDERED_NOTE, dataloader_kwargs, in_order_unsupported
from autotune.result.tuned_config import load_config, write_config
from autotune.trial.child import run_trial
from autotune.trial.loader import build_loader
from autotune.trial.sampling import CycledEpochs
from tests.conftest import make_cuda
from tests.fixtures.runs import cam_grid_request
from tests.result.test_results import make_tuned
from tests.trial.tiny_setups import faulty_spec, linear_setup

CONFIGS = {
    "no-workers": TrialConfig(per_device_batch_size=4),
    "pinned": TrialConfig(per_device_batch_size=4, pin_memory=True),
    "workers-default-prefetch": TrialConfig(per_device_batch_size=4, num_workers=2),
    "workers": TrialConfig(per_device_batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True),
    "unordered": TrialConfig(per_device_batch_size=4, num_workers=2, in_order=False),
    "dynamic": TrialConfig(
        per_device_batch_size=4, num_workers=1, workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 100}
    ),
}
WORKER_OPTIONS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "in_order")


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


class _OneSlowItem(torch.utils.data.Dataset):
    """Eight items; item 0 takes SLOW_S to load, as a long utterance or a drawn augmentation would."""

    SLOW_S = 1.5

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            time.sleep(self.SLOW_S)
        return torch.tensor([index])


@pytest.mark.parametrize("in_order", (True, False))
def test_unordered_workers_hand_over_the_batches_behind_a_slow_one(in_order: bool) -> None:
    """The knob's point, on torch's own DataLoader built by build_loader: with in_order=False the batches queued
    behind a slow one arrive first; every batch still comes exactly once."""
    setup = linear_setup(dataset=_OneSlowItem(), collate_fn=lambda items: torch.cat(items))
    config = TrialConfig(per_device_batch_size=2, num_workers=2, in_order=in_order)
    loader = build_loader(setup, config, total_batches=4, seed=0)
    order = [sorted(batch.tolist()) for batch in loader]
    assert sorted(order) == sorted(sorted(batch) for batch in loader.batch_sampler.make_epoch(0))
    slow_position = next(position for position, batch in enumerate(order) if 0 in batch)
    assert (slow_position == 0) == in_order, order


def test_a_torch_without_in_order_keeps_it_out_of_the_loader_and_the_space(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataLoader without the argument (torch before 2.6): True, its only behaviour, is not passed; False is
    dropped from a searched space with a note, and a space that fixes it is refused in one line."""
    real = torch.utils.data.DataLoader

    class OldDataLoader(real):  # type: ignore[misc,valid-type]
        def __init__(self, dataset: Any, batch_size: int | None = 1, num_workers: int = 0) -> None:
            super().__init__(dataset, batch_size=batch_size, num_workers=num_workers)

    monkeypatch.setattr(torch.utils.data, "DataLoader", OldDataLoader)
    reason = in_order_unsupported()
    assert reason == f"torch {torch.__version__}'s DataLoader has no in_order argument (torch 2.6 added it)"
    workers = TrialConfig(per_device_batch_size=4, num_workers=2)
    assert "in_order" not in dataloader_kwargs(workers)
    assert dataloader_kwargs(dataclasses.replace(workers, in_order=False))["in_order"] is False  # fails loudly there
    params = {"num_workers": {"type": "int", "low": 1, "high": 2}, **IN_ORDER}
    loaded = space.from_dict({"params": params}, make_cuda())
    (param,) = [param for param in loaded.params if param.name == "in_order"]
    assert list(param.distribution.choices) == [True]  # type: ignore[attr-defined]
    assert loaded.space_notes == (f"in_order false left out of the search: {reason}",)
    assert loaded.baseline["in_order"] is True
    with pytest.raises(SpaceError, match="fixed in_order false cannot run here: torch .* no in_order") as error:
        space.from_dict({"params": params, "fixed": {"in_order": False}}, make_cuda())
    assert "\n" not in str(error.value)


def test_this_torch_searches_both_orders_with_workers_only() -> None:
    assert in_order_unsupported() is None
    params = {"num_workers": {"type": "int", "low": 0, "high": 2}, **IN_ORDER}
    loaded = space.from_dict({"params": params}, make_cuda())
    (param,) = [param for param in loaded.params if param.name == "in_order"]
    assert list(param.distribution.choices) == [True, False] and loaded.space_notes == ()  # type: ignore[attr-defined]
    assert not param.applies({"num_workers": 0}, "cuda") and param.applies({"num_workers": 1}, "cuda")
    assert TrialConfig(per_device_batch_size=4, num_workers=0, in_order=False).in_order is True  # normalised


IN_ORDER = {"in_order": {"type": "categorical", "choices": [True, False], "when": {"num_workers": {"at_least": 1}}}}


@pytest.mark.slow
def test_a_real_run_measures_both_orders_and_the_result_hands_over_the_winners(tmp_path: Path, tiny_corpus) -> None:
    """A CPU run of CAM++ over in_order (a space of one's own may search it on a CPU): each order a trial subprocess
    with a worker, its word in the trial line and the table, the winner's in the result's dataloader section."""
    import yaml

    from autotune.result import report
    from autotune.run import runner

    space = (
        "params:\n  in_order: {type: categorical, choices: [true, false]}\n"
        "fixed: {per_device_batch_size: 4, num_workers: 1, persistent_workers: true, precision: fp32,"
        " intra_op_threads: 1}\n"
    )
    request = cam_grid_request(tmp_path, tiny_corpus, space, trials=3)
    run = runner.execute(runner.prepare(request))
    measured = {record.config.in_order: record for record in run.outcome.records if record.role != "preload"}
    assert set(measured) == {True, False}
    assert all(record.result.status == "ok" for record in run.outcome.records), run.outcome.records
    assert run.outcome.records[0].role == "baseline" and run.outcome.records[0].config.in_order is True
    assert {record.config.short() for record in measured.values()} == {
        "bs=4 w=1 persist fp32 thr=1",
        "bs=4 w=1 persist unordered fp32 thr=1",
    }
    tuned = load_config(run.result_path)
    written = yaml.safe_load(Path(run.result_path).read_text())
    assert written["dataloader"]["in_order"] is tuned.config.in_order
    assert tuned.config.in_order is run.outcome.winner.config.in_order  # type: ignore[union-attr]
    assert tuned.dataloader_kwargs()["in_order"] is tuned.config.in_order
    assert (UNORDERED_NOTE in tuned.notes) is (not tuned.config.in_order)  # reproducibility, said where it applies
    frame = report.trials_frame(report.load_study(tuned, None))
    assert str(frame["in_order"].dtype) == "boolean" and set(frame["in_order"].dropna()) == {True, False}
