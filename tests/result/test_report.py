"""Reports: the trial table from a real SQLite study, PNG plots, the self-contained HTML page, CSV, and errors."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest

from autotune.errors import UserError
from autotune.knobs.config import TrialConfig
from autotune.result.plots import make_plots
from autotune.result.report import TRIAL_COLUMNS, ReportFiles, build_report, load_study, trials_frame
from autotune.result.tuned_config import TunedConfig, load_config, write_config
from autotune.trial.spec import TrialResult
from tests.conftest import make_cuda

GIB = 2**30
BASELINE = TrialConfig(per_device_batch_size=32, num_workers=0, precision="fp32")
WINNER = TrialConfig(
    per_device_batch_size=256,
    num_workers=4,
    prefetch_factor=4,
    pin_memory=True,
    persistent_workers=True,
    precision="bf16",
)
RUNNER_UP = TrialConfig(
    per_device_batch_size=128,
    num_workers=4,
    prefetch_factor=2,
    pin_memory=True,
    persistent_workers=True,
    precision="bf16",
)
# (role, config, status, samples/s, data-wait fraction, peak memory GiB)
TRIALS = [
    ("baseline", BASELINE, "ok", 100.0, 0.40, 3.0),
    (
        "search",
        TrialConfig(per_device_batch_size=64, num_workers=2, prefetch_factor=2, pin_memory=True),
        "ok",
        160.0,
        0.22,
        5.5,
    ),
    ("search", RUNNER_UP, "ok", 310.0, 0.08, 6.0),
    ("search", WINNER, "ok", 335.0, 0.06, 11.0),
    ("search", TrialConfig(per_device_batch_size=512, num_workers=4, prefetch_factor=2), "oom", None, None, None),
    ("search", TrialConfig(per_device_batch_size=512, num_workers=8, precision="bf16"), "oom", None, None, None),
    ("search", TrialConfig(per_device_batch_size=64, num_workers=0, precision="bf16"), "pruned", None, None, None),
    ("search", TrialConfig(per_device_batch_size=128, num_workers=2), "ok", 180.0, 0.25, 10.0),
    (
        "search",
        TrialConfig(per_device_batch_size=32, num_workers=8, prefetch_factor=2, precision="bf16"),
        "ok",
        150.0,
        0.05,
        2.2,
    ),
    ("search", TrialConfig(per_device_batch_size=16, num_workers=1), "pruned", None, None, None),
    ("confirm", WINNER, "ok", 328.0, 0.07, 11.1),
    ("confirm", WINNER, "ok", 341.0, 0.05, 11.0),
    ("confirm", RUNNER_UP, "ok", 305.0, 0.09, 6.1),
]
WINNER_SHORT = "bs=256 w=4 pf=4 pin persist bf16"


def _add_trials(study: optuna.Study) -> None:
    for role, config, status, rate, wait, peak in TRIALS:
        result = TrialResult(
            status=status,
            reason="" if status == "ok" else f"{status}: test",
            samples_per_second=rate,
            data_wait_fraction=wait,
            peak_memory_bytes=int(peak * GIB) if peak is not None else None,
            step_time_median_s=0.2,
            wall_s=30.0,
        )
        attrs = {
            "role": role,
            "config": config.to_dict(),
            "result": {k: v for k, v in result.to_dict().items() if k != "log_tail"},
        }
        if status == "pruned":
            trial = optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs=attrs)
        else:
            trial = optuna.trial.create_trial(value=rate or 0.0, user_attrs=attrs)
        study.add_trial(trial)
    study.ask()  # one trial still running: a report leaves it out


def _tuned(study_name: str, storage: str) -> TunedConfig:
    return TunedConfig(
        workload={"name": "cam++", "model": "cam++", "task": "speaker", "options": {}},
        config=WINNER,
        device_type="cuda",
        metrics={
            "objective": "samples_per_second",
            "winner": {"status": "ok", "samples_per_second": 335.0, "measurements": 3},
            "baseline": {"status": "ok", "samples_per_second": 100.0, "measurements": 1},
            "speedup": 3.35,
        },
        hardware=make_cuda().to_dict(),
        data={"source": "synthetic"},
        search={"study_name": study_name, "storage": storage, "baseline_config": BASELINE.to_dict()},
        created="2025-06-01T02:30:00+00:00",
        autotune_version="0.1.0",
        notes=["measured on autotune's synthetic default corpus"],
    )


@pytest.fixture(scope="module")
def study_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, optuna.Study]:
    """A real SQLite study and the result YAML pointing at it (built once: plotting is the slow part)."""
    folder = tmp_path_factory.mktemp("report")
    storage = f"sqlite:///{folder / 'studies.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="cam++-data-gpu", storage=storage, direction="maximize")
    _add_trials(study)
    result_path = write_config(_tuned("cam++-data-gpu", storage), folder / "results" / "cam++" / "gpu.yaml")
    return result_path, storage, study


@pytest.fixture(scope="module")
def built(study_setup: tuple[Path, str, optuna.Study]) -> ReportFiles:
    result_path, _, _ = study_setup
    return build_report(result_path, csv=result_path.parent / "trials.csv")


def test_trials_frame_rows_columns_and_dtypes(study_setup: tuple[Path, str, optuna.Study]) -> None:
    frame = trials_frame(study_setup[2])
    assert list(frame.columns) == list(TRIAL_COLUMNS)
    assert len(frame) == len(TRIALS)  # the running trial is left out
    assert {name: str(dtype) for name, dtype in frame.dtypes.items()} == {
        name: str(pd.Series([], dtype=dtype).dtype) for name, dtype in TRIAL_COLUMNS.items()
    }
    assert frame["number"].tolist() == list(range(len(TRIALS)))
    assert frame["state"].value_counts().to_dict() == {"COMPLETE": 11, "PRUNED": 2}
    assert frame["status"].value_counts().to_dict() == {"ok": 9, "oom": 2, "pruned": 2}
    assert frame["role"].tolist()[0] == "baseline" and frame["role"].tolist().count("confirm") == 3
    assert set(frame["precision"]) == {"fp32", "bf16"}
    assert frame.loc[3, "peak_memory_gib"] == pytest.approx(11.0)
    assert frame.loc[3, "per_device_batch_size"] == 256 and bool(frame.loc[3, "persistent_workers"])
    assert pd.isna(frame.loc[0, "prefetch_factor"]) and pd.isna(frame.loc[4, "samples_per_second"])


def test_plots_are_pngs_of_sensible_size(built: ReportFiles) -> None:
    assert [plot.name for plot in built.plots] == [
        "throughput_vs_batch.png",
        "data_wait_vs_workers.png",
        "throughput_vs_memory.png",
    ]
    for plot in built.plots:
        data = plot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert 15_000 < len(data) < 1_000_000


def test_html_is_one_self_contained_page(built: ReportFiles, study_setup: tuple[Path, str, optuna.Study]) -> None:
    assert built.out_dir == study_setup[0].parent / f"report-{make_cuda().fingerprint()}"
    assert sorted(p.name for p in built.out_dir.iterdir()) == sorted(["report.html", *(p.name for p in built.plots)])
    page = built.html.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 3
    assert "<img" in page and '.png"' not in page  # nothing linked from outside the page
    assert WINNER_SHORT in page
    assert "3.35&times;" in page and "335.0 samples/s" in page and "100.0 samples/s" in page
    assert "NVIDIA A100-SXM4-80GB" in page and "2025-06-01" in page
    trials_table = page[page.index('class="dataframe trials"') :]
    body = trials_table[trials_table.index("<tbody>") : trials_table.index("</tbody>")]
    assert body.count("<tr") == len(TRIALS) == built.trials
    assert body.count('<tr class="winner">') == 3 and body.count('<tr class="baseline">') == 1


def test_csv_round_trips(built: ReportFiles, study_setup: tuple[Path, str, optuna.Study]) -> None:
    assert built.csv is not None
    back = pd.read_csv(built.csv)
    frame = trials_frame(study_setup[2])
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    for column in ("number", "samples_per_second", "data_wait_fraction", "peak_memory_gib", "wall_s"):
        pd.testing.assert_series_equal(back[column], frame[column].astype("float64"), check_dtype=False)
    assert back["precision"].tolist() == frame["precision"].tolist()
    assert back["status"].tolist() == frame["status"].tolist()


def test_redacted_storage_needs_explicit_storage(study_setup: tuple[Path, str, optuna.Study]) -> None:
    tuned = load_config(study_setup[0])
    redacted = dataclasses.replace(tuned, search={**tuned.search, "storage": "postgresql://tuner:***@db/studies"})
    with pytest.raises(UserError, match="--storage") as caught:
        load_study(redacted, None)
    assert "\n" not in str(caught.value)
    assert load_study(redacted, study_setup[1]).study_name == "cam++-data-gpu"


@pytest.mark.parametrize("where", ["other-study", "missing-file"], ids=["study-not-in-storage", "no-such-database"])
def test_missing_study_is_one_line_user_error(study_setup: tuple[Path, str, optuna.Study], where: str) -> None:
    tuned = load_config(study_setup[0])
    if where == "other-study":
        tuned = dataclasses.replace(tuned, search={**tuned.search, "study_name": "nope"})
        storage = None
    else:
        missing = study_setup[0].parent / "missing.db"
        storage = f"sqlite:///{missing}"
    with pytest.raises(UserError) as caught:
        load_study(tuned, storage)
    assert "\n" not in str(caught.value) and re.search(r"nope|does not exist", str(caught.value))
    assert not (study_setup[0].parent / "missing.db").exists()  # nothing created by looking


def test_missing_matplotlib_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, study_setup: tuple[Path, str, optuna.Study]
) -> None:
    for name in [name for name in sys.modules if name.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    frame = trials_frame(study_setup[2])
    with pytest.raises(UserError, match="pip install matplotlib"):
        make_plots(frame, load_config(study_setup[0]), tmp_path)
    assert not any(tmp_path.iterdir())
