"""Space files that build on others (`extends`): the merge rules, one-line errors for a bad reference, and proof that
every built-in space loads exactly as it did when each file spelled everything out (tests/fixtures/space_loads.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import space, yamlio
from autotune.errors import SpaceError
from autotune.space import files as space_files
from tests.conftest import make_cpu, make_cuda
from tests.faults.conftest import error_line, invoke
from tests.fixtures.inductor import NEEDS_INDUCTOR
from tests.fixtures.space_loads import BUILTINS, FIRST_RECORDED, KNOBS_RECORDED, RECORDED, load_everywhere


@NEEDS_INDUCTOR  # recorded where the compile knob is offered; an older torch leaves it out, with its notes
@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_space_loads_as_it_did_spelled_out(name):
    """Params (in order, with distributions and conditions), fixed values, baseline and its notes, seeds and the
    mapping the result file records: the same on a CPU, an A100, a V100, 4 GPUs and a held global batch."""
    recorded = json.loads(RECORDED.read_text())["spaces"][name]
    now = load_everywhere(name)
    assert now["loads"] == recorded["loads"]
    assert now["source"] == recorded["source"]
    assert json.dumps(now) == json.dumps(recorded)  # and every mapping's keys in the same order
    assert "extends" not in now["source"]  # the result file records the whole space, not a reference


# The knobs added to shared/core.yaml since a8cb464, each with the prefix of its space notes.
LATER_KNOBS = ("optimizer_impl", "in_order", "activation_checkpointing", "feature_device", "compile")


def _without_later_knobs(recorded: dict) -> dict:
    """A recording with the knobs added since a8cb464 (LATER_KNOBS) taken out: their parameters, baseline and seed
    values, and the space's notes (on the choices left out on a device; a8cb464 recorded no such key)."""
    stripped = json.loads(json.dumps(recorded))
    for load in stripped["loads"].values():
        if "error" in load:
            continue
        load["params"] = [param for param in load["params"] if param["name"] not in LATER_KNOBS]
        for name in LATER_KNOBS:
            load["baseline"].pop(name, None)
            for seed in load["seeds"]:
                seed.pop(name, None)
        assert all(note.startswith(tuple(f"{name} " for name in LATER_KNOBS)) for note in load.pop("space_notes"))
    for name in LATER_KNOBS:
        stripped["source"]["params"].pop(name, None)
    cuda = stripped["source"].get("cuda") or {}
    for section in ("params", "baseline"):  # activation_checkpointing: cam++'s and the conformer's CUDA sections
        if (cuda.get(section) or {}).pop("activation_checkpointing", None) is not None and not cuda[section]:
            del cuda[section]
    return stripped


@pytest.mark.parametrize("name", BUILTINS)
def test_the_spaces_differ_from_the_knobs_recording_only_by_the_conformers_careful_cpu_seed(name):
    """The conformer's first CPU seed became what a careful user sets by hand (the recipe's batch in bf16, a
    persistent worker per core: benchmarks/README.md#against-the-peers); nothing else in any space changed."""
    recorded = json.loads(RECORDED.read_text())["spaces"][name]
    before = json.loads(KNOBS_RECORDED.read_text())["spaces"][name]
    if name == "conformer":
        for machine, load in recorded["loads"].items():
            if load.get("device_type") != "cpu":
                continue
            careful, cores = load["seeds"][0], {"cpu-2-cores": 2, "cpu-2-cores-2-ranks-global-32": 1}[machine]
            assert careful["batch_type"] == "static" and careful["per_device_batch_size"] == 16, machine
            assert careful["precision"] == "bf16" and careful["persistent_workers"] is True
            assert careful["num_workers"] == careful["intra_op_threads"] == cores  # every core a rank has
            load["seeds"][0] = before["loads"][machine]["seeds"][0]
        recorded["source"]["cpu"]["seeds"][0] = before["source"]["cpu"]["seeds"][0]
    assert json.dumps(recorded) == json.dumps(before)


@pytest.mark.parametrize("name", BUILTINS)
def test_the_recording_differs_from_the_first_only_by_the_optimizer_knob(name):
    """The spaces were re-recorded when shared/core.yaml gained optimizer_impl: without it they are a8cb464's loads,
    and with it every space searches it on CUDA from a `default` baseline, foreach left out there (torch's default);
    on a CPU it is not searched (its step is ~1% of a CAM++ step there: core.yaml)."""
    recorded = json.loads(KNOBS_RECORDED.read_text())["spaces"][name]
    assert _without_later_knobs(_without_buckets(recorded)) == json.loads(FIRST_RECORDED.read_text())["spaces"][name]
    for machine, load in recorded["loads"].items():
        found = [param for param in load["params"] if param["name"] == "optimizer_impl"]
        if load["device_type"] == "cpu":
            assert found == [] and "optimizer_impl" not in load["baseline"] and load["space_notes"] == [], machine
            continue
        (param,) = found
        assert json.loads(param["distribution"])["attributes"]["choices"] == ["default", "fused"], machine
        assert load["baseline"]["optimizer_impl"] == "default"
        assert any(note.startswith("optimizer_impl foreach left out") for note in load["space_notes"])


@pytest.mark.parametrize("name", BUILTINS)
def test_the_spaces_search_the_feature_placement_for_cam_eres2net_and_the_conformer_on_cuda_only(name):
    """shared/3d-speaker.yaml gained feature_device: CAM++'s and ERes2Net's spaces search it on CUDA, their
    baseline and seeds at the recipe's `workers`; so does conformer.yaml since the conformer can compute its fbank
    and SpecAugment in the step (autotune/data/asr_features.py); on a CPU, and in every other space, it is absent."""
    recorded = json.loads(RECORDED.read_text())["spaces"][name]
    knob = recorded["source"].get("params", {}).get("feature_device")
    assert (knob is not None) == (name in ("cam++", "eres2net", "eres2net-large", "conformer"))
    for machine, load in recorded["loads"].items():
        if "error" in load:
            continue
        named = [param["name"] for param in load["params"]].count("feature_device")
        assert named == (1 if knob and load["device_type"] == "cuda" else 0), machine
        assert load["baseline"].get("feature_device", "workers") == "workers"
        assert all(seed.get("feature_device", "workers") == "workers" for seed in load["seeds"])


@pytest.mark.parametrize("name", BUILTINS)
def test_the_spaces_search_in_order_on_cuda_with_workers_from_the_recipes_in_order_loader(name):
    """in_order is searched on CUDA only, when there are workers, from DataLoader's default (True) as
    every recipe runs it; this torch has the argument, so nothing is left out (tests/trial/test_dataloader.py)."""
    for machine, load in json.loads(RECORDED.read_text())["spaces"][name]["loads"].items():
        found = [param for param in load["params"] if param["name"] == "in_order"]
        if load["device_type"] == "cpu":
            assert found == [] and "in_order" not in load["baseline"], machine
            continue
        (param,) = found
        assert json.loads(param["distribution"])["attributes"]["choices"] == [True, False], machine
        assert param["when"] == {"num_workers": {"at_least": 1}}
        assert load["baseline"].get("in_order", True) is True
        assert not any(note.startswith("in_order") for note in load["space_notes"])


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_space_searches_compile_on_cuda_only_from_an_eager_baseline(name):
    """Re-recorded when shared/core.yaml gained compile: searched on CUDA (off, default, dynamic; this environment has
    Triton), from the recipes' eager baseline; not on a CPU, where a compile of CAM++ costs minutes."""
    recorded = json.loads(RECORDED.read_text())["spaces"][name]
    for machine, load in recorded["loads"].items():
        found = [param for param in load["params"] if param["name"] == "compile"]
        if load["device_type"] == "cpu":
            assert found == [] and "compile" not in load["baseline"], machine
            continue
        (param,) = found
        assert json.loads(param["distribution"])["attributes"]["choices"] == ["off", "default", "dynamic"], machine
        assert load["baseline"]["compile"] == "off"
        assert not any(note.startswith("compile ") for note in load["space_notes"])


_BUCKET_KNOBS = ("num_buckets", "bucket_scaling")


def _without_bucket_batch_type(params: dict) -> None:
    """A space file's params (the recorded mapping) as before batch_type bucket: its choice, its knobs and the
    frame budget's condition on it taken out."""
    for knob in _BUCKET_KNOBS:
        params.pop(knob, None)
    if "bucket" in params.get("batch_type", {}).get("choices", []):
        params["batch_type"]["choices"].remove("bucket")
    if params.get("max_frames_in_batch", {}).get("when") == {"batch_type": ["dynamic", "bucket"]}:
        params["max_frames_in_batch"]["when"] = {"batch_type": "dynamic"}


def _without_buckets(recorded: dict) -> dict:
    """A recording with the conformer's batch_type bucket taken out, in its loads and its source."""
    stripped = json.loads(json.dumps(recorded))
    for load in stripped["loads"].values():
        if "error" in load:
            continue
        load["params"] = [param for param in load["params"] if param["name"] not in _BUCKET_KNOBS]
        for param in load["params"]:
            distribution = json.loads(param["distribution"])
            choices = distribution["attributes"].get("choices")
            if param["name"] == "batch_type" and "bucket" in choices:
                choices.remove("bucket")
                param["distribution"] = json.dumps(distribution)
            if param["when"] == {"batch_type": ["dynamic", "bucket"]}:
                param["when"] = {"batch_type": "dynamic"}
        load["seeds"] = [seed for seed in load["seeds"] if seed.get("batch_type") != "bucket"]
    source = stripped["source"]
    _without_bucket_batch_type(source["params"])
    source.get("cpu", {}).get("params", {}).pop("batch_type", None)  # the CPU space's batch types, without bucket
    if "cuda" in source:
        source["cuda"]["seeds"] = [seed for seed in source["cuda"]["seeds"] if seed.get("batch_type") != "bucket"]
    return stripped


@pytest.mark.parametrize("name", BUILTINS)
def test_only_the_conformer_searches_bucket_batches_and_on_cuda_only(name):
    """The conformer gained batch_type bucket: it searches it on CUDA only (a third seed there), never on a CPU;
    without it every space loads as at a8cb464 (with the other knobs added since stripped, the test above)."""
    recorded = json.loads(RECORDED.read_text())["spaces"][name]
    for machine, load in recorded["loads"].items():
        batch_type = [json.loads(p["distribution"]) for p in load.get("params", []) if p["name"] == "batch_type"]
        if name != "conformer" or "error" in load:
            assert batch_type == [], machine
            continue
        offered = batch_type[0]["attributes"]["choices"]
        assert ("bucket" in offered) == (load["device_type"] == "cuda"), machine
        assert any(seed["batch_type"] == "bucket" for seed in load["seeds"]) == (load["device_type"] == "cuda")


def test_builtin_spaces_say_only_what_differs():
    """ECAPA-TDNN 512 is ECAPA-TDNN by another name; eres2net-large is eres2net with its own CPU seeds."""
    ecapa_512 = yamlio.read_mapping(space.space_path("ecapa-tdnn-512"), what="space")
    assert ecapa_512 == {"extends": "ecapa-tdnn", "workload": "ecapa-tdnn-512"}
    large = yamlio.read_mapping(space.space_path("eres2net-large"), what="space")
    assert set(large) == {"extends", "workload", "cpu"} and set(large["cpu"]) == {"seeds"}
    assert {"shared/core", "shared/3d-speaker", "cam++"} <= set(space_files.builtin_names())


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_merge_rules(tmp_path):
    _write(
        tmp_path,
        "base.yaml",
        "workload: base\ndescription: the base\n"
        "params:\n"
        "  num_workers: {type: int, low: 0, high: 4}\n"
        "  prefetch_factor: {type: int, low: 1, high: 8, when: {num_workers: {at_least: 1}}}\n"
        "  pin_memory: {type: categorical, choices: [false, true]}\n"
        "fixed: {cudnn_benchmark: true}\n"
        "baseline: {num_workers: 2, prefetch_factor: 2}\n"
        "cpu: {params: {num_workers: {type: int, low: 0, high: 2}}, seeds: [{num_workers: 1}]}\n",
    )
    child = _write(
        tmp_path,
        "child.yaml",
        "extends: base.yaml\n"
        "params:\n"
        "  per_device_batch_size: {type: categorical, choices: [8, 16]}\n"  # new: comes first
        "  prefetch_factor: {type: categorical, choices: [2, 4]}\n"  # replaced whole, in the base's place
        "  pin_memory: null\n"  # removed
        "baseline: {num_workers: 0}\n"  # merged key by key
        "cpu: {seeds: [{num_workers: 0}]}\n",  # a list is replaced; the base's cpu params stay
    )
    merged = space_files.read(child)
    assert list(merged["params"]) == ["per_device_batch_size", "num_workers", "prefetch_factor"]
    assert merged["params"]["prefetch_factor"] == {"type": "categorical", "choices": [2, 4]}  # no low/high/when left
    assert merged["baseline"] == {"num_workers": 0, "prefetch_factor": 2}
    assert merged["cpu"] == {
        "params": {"num_workers": {"type": "int", "low": 0, "high": 2}},
        "seeds": [{"num_workers": 0}],
    }
    assert "workload" not in merged and "description" not in merged  # the base's name is not this file's
    loaded = space.load(child, make_cpu(4))
    assert [p.name for p in loaded.params] == ["per_device_batch_size", "num_workers", "prefetch_factor"]
    assert loaded.fixed == {"cudnn_benchmark": True} and loaded.baseline["num_workers"] == 0


def test_a_user_space_extends_a_builtin_by_name(tmp_path):
    """The common case: the cam++ space with other batches, everything else as shipped."""
    mine = _write(
        tmp_path,
        "mine.yaml",
        "extends: cam++\nworkload: cam++\n"
        "params:\n  per_device_batch_size: {type: categorical, choices: [512, 1024]}\n",
    )
    shipped, loaded = space.load(space.space_path("cam++"), make_cuda()), space.load(mine, make_cuda())
    assert [p.name for p in loaded.params] == [p.name for p in shipped.params]
    assert list(loaded.params[0].distribution.choices) == [512, 1024]
    assert loaded.params[1:] == shipped.params[1:] and loaded.fixed == shipped.fixed
    from_code = space.from_dict({"extends": "cam++", "workload": "cam++"}, make_cuda())
    assert from_code.params == shipped.params and from_code.baseline == shipped.baseline


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("extends: cam+\n", "extends 'cam+', which is no built-in space; use one of cam++, "),
        ("extends: ../setup\n", "which is no built-in space"),
        ("extends: missing.yaml\n", "but {folder}/missing.yaml is not a file"),
        ("extends: [cam++]\n", "'extends' must name a space: a built-in (cam++, "),
        ("extends: cam++\nparams: {pin_memroy: null}\n", "params.pin_memroy is null, which removes a key"),
        ("extends: space.yaml\n", "'extends' goes round in a circle"),
    ],
)
def test_a_bad_reference_is_one_line(tmp_path, text, words):
    path = _write(tmp_path, "space.yaml", text)
    with pytest.raises(SpaceError) as caught:
        space.load(path, make_cpu())
    message = str(caught.value)
    assert words.format(folder=tmp_path) in message and "\n" not in message
    assert message.startswith(str(path))


def test_a_cycle_through_two_files_is_refused(tmp_path):
    _write(tmp_path, "a.yaml", "extends: b.yaml\n")
    b = _write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(SpaceError, match=r"goes round in a circle \(.*b.yaml -> .*a.yaml -> .*b.yaml\)"):
        space.load(b, make_cpu())


def test_the_cli_refuses_a_bad_reference_before_anything_runs(tmp_path, tiny_corpus):
    bad = _write(tmp_path, "space.yaml", "extends: cam+\n")
    args = ["--model", "cam++", "--data", str(tiny_corpus), "--space", str(bad), "--results-dir", str(tmp_path / "r")]
    result = invoke(["run", *args])
    assert result.exit_code == 2
    assert "extends 'cam+', which is no built-in space" in error_line(result.stderr)
    assert not (tmp_path / "r").exists()  # nothing written


@pytest.mark.parametrize(("model", "knob"), [("cam++", "num_buckets"), ("eres2net", "batch_type")])
def test_bucket_knobs_for_fixed_length_crops_are_refused_before_anything_runs(tmp_path, tiny_corpus, model, knob):
    text = f"extends: {model}\nparams:\n  {knob}: {{type: categorical, choices: [8]}}\n"
    bad = _write(tmp_path, "space.yaml", text)
    args = ["--model", model, "--data", str(tiny_corpus), "--space", str(bad), "--results-dir", str(tmp_path / "r")]
    result = invoke(["run", *args])
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert f"{knob} batches items by their length" in line and "remove it" in line
    assert not (tmp_path / "r").exists()  # nothing written, no trial
