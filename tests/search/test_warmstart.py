"""Warm start: what a rerun re-measures first (previous winner, best neighbours) and how much it searches after."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune import space as space_module
from autotune.knobs.config import TrialConfig
from autotune.result.tuned_config import TunedConfig, write_config
from autotune.search.settings import TunerSettings
from autotune.search.warmstart import plan_warm_start
from tests.conftest import make_cpu

SPACE = space_module.from_dict(
    {
        "params": {
            "per_device_batch_size": {"type": "categorical", "choices": [8, 16, 32]},
            "num_workers": {"type": "int", "low": 0, "high": 2},
            "precision": {"type": "categorical", "choices": ["fp32", "bf16"]},
        },
        "baseline": {"per_device_batch_size": 32},
    },
    make_cpu(),
    origin="test space",
)
SETTINGS = TunerSettings(trials=24, budget_s=900.0)


def _config(batch: int, workers: int = 0, precision: str = "bf16") -> TrialConfig:
    return TrialConfig(per_device_batch_size=batch, num_workers=workers, precision=precision)


def _study(*measured: tuple[TrialConfig, float, str], wall_s: float | None = None) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for config, rate, status in measured:
        result = {"status": status, **({"wall_s": wall_s} if wall_s else {})}
        study.add_trial(
            optuna.trial.create_trial(value=rate, user_attrs={"config": config.to_dict(), "result": result})
        )
    return study


STUDY_TRIALS = (
    (_config(16), 100.0, "ok"),
    (_config(16), 110.0, "ok"),  # median 105
    (_config(32, 2), 90.0, "ok"),
    (_config(8), 95.0, "ok"),
    (_config(8, 1, "fp32"), 500.0, "oom"),  # infeasible: never a neighbour
    (_config(64), 120.0, "ok"),  # outside this space
)


def _previous_yaml(path: Path, config: TrialConfig, *, study_name: str = "study", options=None) -> Path:
    tuned = TunedConfig(
        workload={"name": "cam++", "model": "cam++", "task": "speaker", "options": options or {}},
        config=config,
        device_type="cpu",
        metrics={"winner": {"status": "ok", "samples_per_second": 98.0}},
        hardware=make_cpu().to_dict(),
        data={},
        search={"study_name": study_name},
        created="2026-11-01T02:30:00+00:00",
        autotune_version="0.1.0",
    )
    return write_config(tuned, path)


def _plan(study, out: Path, **kwargs):
    return plan_warm_start(
        study, out_path=out, study_name="study", space=SPACE, options={}, settings=SETTINGS, **kwargs
    )


def test_the_previous_yaml_winner_comes_first_then_the_best_neighbours(tmp_path):
    out = _previous_yaml(tmp_path / "r.yaml", _config(32, 2))
    warm = _plan(_study(*STUDY_TRIALS), out)
    assert warm.previous is not None and warm.previous.samples_per_second == 98.0
    # bs=64 ranks first in the study but lies outside this space: skipped, and said so.
    assert [(p.role, p.config.short()) for p in warm.points] == [
        ("previous", "bs=32 w=2 bf16"),
        ("warm", "bs=16 w=0 bf16"),
        ("warm", "bs=8 w=0 bf16"),
    ]
    assert warm.trials()[0] == ("previous", {"per_device_batch_size": 32, "num_workers": 2, "precision": "bf16"})
    assert any("skips bs=64" in note and "outside the current search space" in note for note in warm.notes)
    assert (warm.settings.trials, warm.settings.budget_s) == (12, 450.0)
    text = "\n".join(warm.describe())
    assert f"re-measuring the previous winner bs=32 w=2 bf16 from previous result {out} (2026-11-01, 98.0" in text
    assert "neighbour bs=16 w=0 bf16 from study trial #1 (105.0 samples/s)" in text
    assert "24 -> 12 trials, budget 15.0 -> 7.5 min" in text


def test_without_a_yaml_the_study_best_is_the_previous_winner(tmp_path):
    warm = _plan(_study(*STUDY_TRIALS), tmp_path / "absent.yaml", neighbours=1)
    assert warm.previous is None
    assert [(p.role, p.config.short(), p.source) for p in warm.points] == [
        ("previous", "bs=16 w=0 bf16", "study trial #1 (105.0 samples/s)"),
        ("warm", "bs=8 w=0 bf16", "study trial #3 (95.0 samples/s)"),
    ]


@pytest.mark.parametrize(
    ("yaml_kwargs", "note"),
    [({"study_name": "other"}, "is from another study (other)"), ({"options": {"crop_s": 1.0}}, "other workload")],
    ids=["other-study", "other-options"],
)
def test_a_yaml_from_another_study_or_options_is_not_compared(tmp_path, yaml_kwargs, note):
    out = _previous_yaml(tmp_path / "r.yaml", _config(32, 2), **yaml_kwargs)
    warm = _plan(_study(*STUDY_TRIALS), out)
    assert warm.previous is None and any(note in line for line in warm.notes)
    assert warm.points[0].config == _config(16)  # the study's best instead


def test_a_first_run_and_a_disabled_warm_start_search_as_asked(tmp_path):
    cold = _plan(_study(), tmp_path / "absent.yaml")
    assert cold.points == () and cold.settings == SETTINGS and cold.describe() == []
    out = _previous_yaml(tmp_path / "r.yaml", _config(32, 2))
    off = _plan(_study(*STUDY_TRIALS), out, enabled=False)
    assert off.points == () and off.settings == SETTINGS and off.previous is not None


def test_a_small_trial_count_still_measures_every_point(tmp_path):
    warm = plan_warm_start(
        _study(*STUDY_TRIALS),
        out_path=tmp_path / "absent.yaml",
        study_name="study",
        space=SPACE,
        options={},
        settings=TunerSettings(trials=6, budget_s=None),
    )
    assert len(warm.points) == 3 and warm.settings.trials == 5 and warm.settings.budget_s is None


def test_a_previous_winner_outside_the_space_is_not_remeasured_as_previous(tmp_path):
    out = _previous_yaml(tmp_path / "r.yaml", _config(64))
    warm = _plan(_study(*STUDY_TRIALS), out)
    assert warm.previous is not None  # still the bar for the keep-or-write decision
    assert [p.role for p in warm.points] == ["warm", "warm"]  # so the drift check compares nothing else with it
    assert any("skips the previous winner bs=64" in note for note in warm.notes)


@pytest.mark.parametrize(
    ("budget_s", "trial_s", "kept_s"),
    [(900.0, 60.0, 450.0), (300.0, 60.0, 300.0), (600.0, 60.0, 420.0), (300.0, 0.0, 150.0)],
    ids=["half-holds-it", "half-too-short", "partly", "no-wall-times"],
)
def test_a_short_budget_is_not_halved_below_what_the_warm_start_itself_needs(tmp_path, budget_s, trial_s, kept_s):
    """Three points, the baseline, a search trial and two confirmations: 7 trials. At 60 s each (a CPU trial) that is
    7 min: half of 15 min holds it; half of 5 min (a nightly --budget 5m, once cut to 2.5 min and the baseline alone)
    does not, so the whole 5 min stays; half of 10 min is raised to the 7 min it needs."""
    warm = plan_warm_start(
        _study(*STUDY_TRIALS, wall_s=trial_s),
        out_path=tmp_path / "absent.yaml",
        study_name="study",
        space=SPACE,
        options={},
        settings=TunerSettings(trials=24, budget_s=budget_s),
    )
    assert len(warm.points) == 3 and warm.settings.budget_s == kept_s
    kept_whole = any(
        "keeps the whole --budget 5.0 min" in note and "(~7.0 min at the trial" in note for note in warm.notes
    )
    assert kept_whole == (budget_s == 300.0 and trial_s > 0)
    assert ("budget" in warm.describe()[-1]) == (kept_s != budget_s)


def test_the_warm_start_prices_the_baseline_at_its_own_recorded_time(tmp_path):
    """A CPU rerun: the baseline took 106 s, the bf16 points 26-29 s. The median alone (28 s) priced the
    warm start at 3.3 min; the baseline at its own time, each point at its own and three trials at the median: 4.6."""
    study = _study(*STUDY_TRIALS, wall_s=28.0)
    baseline = {
        "config": _config(32, 2, "fp32").to_dict(),
        "role": "baseline",
        "result": {"status": "ok", "wall_s": 106.0},
    }
    study.add_trial(optuna.trial.create_trial(value=3.8, user_attrs=baseline))
    warm = plan_warm_start(
        study,
        out_path=tmp_path / "absent.yaml",
        study_name="study",
        space=SPACE,
        options={},
        settings=TunerSettings(trials=24, budget_s=300.0),
    )
    assert len(warm.points) == 3
    assert warm.settings.budget_s == pytest.approx(106.0 + 3 * 28.0 + 3 * 28.0)
