"""The knob declarations: everything a knob needs is there, and what derives from them is what was written by hand.

Adding a knob to autotune/knobs/declarations.py without its TrialConfig field fails here; the result file, the trial
table and the export targets have their own checks below (docs/adding-a-knob.md lists them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pandas as pd
import pytest

from autotune import space
from autotune.exports import TARGETS, ExportContext, export
from autotune.exports.base import TARGET_KNOBS
from autotune.knobs import declarations as knobs
from autotune.knobs.config import TrialConfig
from autotune.result import plots as report_plots
from autotune.result import report
from autotune.result.tuned_config import TunedConfig
from tests.exports.common import MODEL_FOR

WORKLOAD_FIELD = "workload_knobs"


def test_names_are_unique_and_sections_known() -> None:
    assert len(set(knobs.NAMES)) == len(knobs.NAMES)
    for knob in knobs.KNOBS:
        assert knob.section in knobs.RESULT_SECTIONS, knob.name
        assert knob.type in (int, bool, str), knob.name
        assert knob.minimum is None or knob.type is int, knob.name
    keys = [(knob.section, knob.result_key) for knob in knobs.KNOBS]
    assert len(set(keys)) == len(keys)


def test_trial_config_has_one_typed_field_per_knob() -> None:
    fields = {field.name: field for field in dataclasses.fields(TrialConfig)}
    assert set(fields) == {*knobs.NAMES, WORKLOAD_FIELD}
    for knob in knobs.KNOBS:
        assert knob.type.__name__ in str(fields[knob.name].type), knob.name


@pytest.mark.parametrize("knob", knobs.KNOBS, ids=lambda knob: knob.name)
def test_every_knob_has_a_word_or_says_why_not(knob: knobs.Knob) -> None:
    """A knob's word is its own (one knob's word is never another's), or None by an explicit choice."""
    value = _changed(knob)
    word = knob.word(value)
    if word is None:
        assert knob.word.__doc__, f"{knob.name} is left out of the trial line without saying why"
    else:
        assert word and " " not in word


def test_trial_line_is_unchanged_by_the_declarations() -> None:
    """The words TrialConfig.short() wrote by hand before the declarations (recorded benchmark runs key by them)."""
    plain = TrialConfig(per_device_batch_size=64, num_workers=0)
    full = TrialConfig(
        per_device_batch_size=32,
        num_workers=4,
        prefetch_factor=2,
        pin_memory=True,
        persistent_workers=True,
        precision="bf16",
        cudnn_benchmark=False,
        intra_op_threads=3,
        world_size=2,
        grad_accum_steps=4,
        preload_audio=True,
        workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 12000},
    )
    assert plain.short() == "bs=64 w=0 fp32"
    assert full.short() == (
        "bs=32 w=4 pf=2 pin persist bf16 thr=3 x2dev accum=4 preload batch_type=dynamic max_frames_in_batch=12000"
    )
    # Knobs added since keep these lines at their default and add their word after it.
    assert dataclasses.replace(plain, optimizer_impl="fused").short() == "bs=64 w=0 fp32 fused"
    foreach = dataclasses.replace(full, optimizer_impl="foreach").short()
    assert foreach.startswith("bs=32 w=4 pf=2 pin persist bf16 foreach thr=3 ")
    unordered = dataclasses.replace(full, in_order=False).short()
    assert unordered.startswith("bs=32 w=4 pf=2 pin persist unordered bf16 thr=3 ")
    assert dataclasses.replace(plain, in_order=False).short() == "bs=64 w=0 fp32"  # no workers: always in order
    assert dataclasses.replace(plain, activation_checkpointing=True).short() == "bs=64 w=0 fp32 ckpt"
    assert dataclasses.replace(plain, activation_checkpointing=False).short() == "bs=64 w=0 fp32 no-ckpt"
    assert dataclasses.replace(plain, compile="dynamic").short() == "bs=64 w=0 fp32 compile=dynamic"


def test_space_parameters_derive_from_the_declarations() -> None:
    assert space.CORE_PARAMS == {
        "per_device_batch_size": int,
        "num_workers": int,
        "prefetch_factor": int,
        "pin_memory": bool,
        "persistent_workers": bool,
        "in_order": bool,
        "precision": str,
        "optimizer_impl": str,
        "activation_checkpointing": bool,
        "intra_op_threads": int,
        "cudnn_benchmark": bool,
        "feature_device": str,
        "compile": str,
    }
    assert space.MINIMUM == {"per_device_batch_size": 1, "num_workers": 0, "prefetch_factor": 1, "intra_op_threads": 1}
    assert space.RECIPE_SETTINGS == {"grad_accum_steps": int}


def _changed(knob: knobs.Knob) -> Any:
    """A value of the knob other than TrialConfig's default (and valid with workers)."""
    if knob.choices:
        return knob.choices[-1]
    if knob.type is bool:
        default = {field.name: field.default for field in dataclasses.fields(TrialConfig)}[knob.name]
        return not default
    return 3


def _everything_changed(**changes: Any) -> TrialConfig:
    """A configuration with every knob away from its default (workers on, so that the loader's knobs all apply)."""
    values = {knob.name: _changed(knob) for knob in knobs.KNOBS}
    return TrialConfig(**{**values, **changes})


def _tuned(config: TrialConfig) -> TunedConfig:
    return TunedConfig(
        workload={"name": "cam++"},
        config=config,
        device_type="cuda",
        metrics={},
        hardware={},
        data={},
        search={},
        created="2026-11-24T00:00:00+00:00",
        autotune_version="0.1.0",
    )


@pytest.mark.parametrize("knob", knobs.KNOBS, ids=lambda knob: knob.name)
def test_every_knob_is_written_in_its_result_section_and_read_back(knob: knobs.Knob) -> None:
    default = TrialConfig(per_device_batch_size=8, num_workers=2)
    for config in (default, _everything_changed(), dataclasses.replace(default, **{knob.name: _changed(knob)})):
        written = _tuned(config).to_dict()
        assert written[knob.section].get(knob.result_key) == getattr(config, knob.name), knob.name
        assert TunedConfig.from_dict(written).config == config


@pytest.mark.parametrize("knob", knobs.KNOBS, ids=lambda knob: knob.name)
def test_a_result_without_a_knob_fails_only_when_every_result_has_it(knob: knobs.Knob) -> None:
    written = _tuned(_everything_changed()).to_dict()
    del written[knob.section][knob.result_key]
    if knob.required:
        with pytest.raises(KeyError):
            TunedConfig.from_dict(written)
    else:  # an older result: the knob reads TrialConfig's default
        read = TunedConfig.from_dict(written).config
        assert getattr(read, knob.name) == getattr(TrialConfig(per_device_batch_size=1), knob.name)


def test_every_knob_has_a_typed_column_in_the_trial_table_and_csv() -> None:
    """Every knob is a column (workload knobs follow the declared ones), filled from the trial's stored config."""
    for knob in knobs.KNOBS:
        assert report.TRIAL_COLUMNS[knob.name] == knob.column_dtype
    assert report_plots.KNOBS == knobs.NAMES
    config = _everything_changed(workload_knobs={"batch_type": "dynamic", "max_frames_in_batch": 12000})
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"config": config.to_dict(), "role": "search"}))
    old = {key: value for key, value in config.to_dict().items() if key != "preload_audio"}  # before preloading
    study.add_trial(optuna.trial.create_trial(value=2.0, user_attrs={"config": old, "role": "search"}))
    frame = report.trials_frame(study)
    assert list(frame.columns) == [*report.TRIAL_COLUMNS, "batch_type", "max_frames_in_batch"]
    assert str(frame["max_frames_in_batch"].dtype) == "Int64" and str(frame["batch_type"].dtype) == "string"
    row = frame.iloc[0]
    for knob in knobs.KNOBS:
        assert row[knob.name] == getattr(config, knob.name), knob.name
    assert row["max_frames_in_batch"] == 12000 and row["batch_type"] == "dynamic"
    assert pd.isna(frame.iloc[1]["preload_audio"])


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_export_target_says_how_it_takes_every_knob(target: str) -> None:
    """A target's table names every knob: what carries it, or the note saying it cannot, and that note is given for
    a tuned value the target does not run."""
    table = TARGET_KNOBS[target]
    assert list(table) == list(knobs.NAMES), f"{target}'s knob table misses {set(knobs.NAMES) - set(table)}"
    model, task = MODEL_FOR[target]
    results = [
        dataclasses.replace(_tuned(config), workload={"name": model, "task": task})
        for config in (TrialConfig(per_device_batch_size=8, num_workers=2), _everything_changed())
    ]
    for name, entry in table.items():
        assert entry.how or entry.notes is not None, f"{target} says nothing of {name}"
        if not entry.how:
            said = [entry.notes_for(ExportContext(tuned=tuned, world_size=1)) for tuned in results]
            assert any(said), f"{target} cannot carry {name} but never says so"
    for tuned in results:
        notes = export(tuned, target).notes
        for entry in table.values():
            assert set(entry.notes_for(ExportContext(tuned=tuned, world_size=tuned.config.world_size))) <= set(notes)


def test_workload_knobs_keep_their_earlier_name_for_readers_and_stored_trials() -> None:
    """`extra` was the workload knobs' name: users' code may read it, and studies of earlier runs stored it."""
    config = TrialConfig(per_device_batch_size=4, num_workers=1, workload_knobs={"batch_type": "dynamic"})
    assert config.extra is config.workload_knobs
    stored = {key: value for key, value in config.to_dict().items() if key != "workload_knobs"}
    stored["extra"] = {"batch_type": "dynamic"}
    assert TrialConfig.from_dict(stored) == config
    assert knobs.flat_values(stored)["batch_type"] == "dynamic"


@pytest.mark.parametrize("knob", [k for k in knobs.KNOBS if k.applies == "dataloader"], ids=lambda knob: knob.name)
def test_every_dataloader_knob_reaches_the_loader_users_build(knob: knobs.Knob) -> None:
    base = TrialConfig(per_device_batch_size=8, num_workers=2)
    changed = dataclasses.replace(base, **{knob.name: _changed(knob)})
    assert _tuned(changed).dataloader_kwargs() != _tuned(base).dataloader_kwargs()
