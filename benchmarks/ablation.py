"""Knob ablation: which knobs earned their place in a winner.

Takes a result YAML (what `autotune run` wrote) and measures, in real trials on this machine, the winner beside the
winner with each knob that differs from the recipe baseline set back to the baseline's value, one knob at a time
(a DataLoader knob that only exists with workers follows num_workers back to 0). The configurations are measured in
interleaved rounds (every one once per round, in a rotated order), so that a change of load shifts them all alike;
each is reported as the ratio of its median to the winner's median from the same rounds. A knob whose flip costs
less than the winner's own spread earned nothing measurable here.

    .venv/bin/autotune run --model cam++ --budget 5m --out /tmp/campp.yaml
    .venv/bin/python benchmarks/ablation.py /tmp/campp.yaml --rounds 3 --out benchmarks/results/ablation-cam++.md

The data is the run's default embedded corpus unless --data names the run's list; the space file is the model's
built-in one unless --space names the run's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import load_config, yamlio
from autotune.knobs import declarations as knobs
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.run import runner  # noqa: E402
from autotune.run.plan import RunRequest  # noqa: E402
from autotune.search.settings import TunerSettings  # noqa: E402
from autotune.trial import launch

# Knobs that only exist with DataLoader workers: no row for them when the winner has none (and with num_workers
# flipped back to 0, TrialConfig itself unsets them).
_WORKER_ONLY = ("prefetch_factor", "persistent_workers", "in_order")


def baseline_config(plan: Any) -> TrialConfig:
    """The recipe baseline as the run measured it: the space's fixed values and baseline, fitted to this machine."""
    params = {**plan.space.fixed, **plan.space.baseline}
    return TrialConfig.from_params(params, world_size=plan.world_size, workload_knobs=tuple(plan.workload.knobs))


def flips(winner: TrialConfig, baseline: TrialConfig) -> dict[str, TrialConfig]:
    """One configuration per knob whose winning value differs from the baseline's: the winner with that knob back."""
    found: dict[str, TrialConfig] = {}
    for knob in knobs.KNOBS:
        if knob.space == "run" and knob.name != "preload_audio":  # world_size: the experiment, not a choice
            continue
        won, recipe = getattr(winner, knob.name), getattr(baseline, knob.name)
        if won == recipe or (knob.name in _WORKER_ONLY and winner.num_workers == 0):
            continue
        found[f"{knob.name} {won} -> {recipe}"] = dataclasses.replace(winner, **{knob.name: recipe})
    for name, won in winner.workload_knobs.items():
        recipe = baseline.workload_knobs.get(name)
        if recipe is not None and won != recipe:
            knobs_back = {**winner.workload_knobs, name: recipe}
            found[f"{name} {won} -> {recipe}"] = dataclasses.replace(winner, workload_knobs=knobs_back)
    return found


def measure(configs: dict[str, TrialConfig], plan: Any, rounds: int, workdir: Path) -> dict[str, list[float]]:
    data_file = yamlio.write_json(workdir / "data.json", plan.data.to_dict())
    runner.prepare_data(plan)  # the recipe's one-off preparation (CMVN, TTS targets), as a run does it
    settings = plan.request.settings
    make_spec = runner.spec_maker(plan, settings, data_file)  # trials specified exactly as a run specifies them
    values: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for round_number in range(rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in order:
            folder = workdir / f"r{round_number}-{names.index(name)}"
            spec = make_spec(configs[name], str(folder / "result.json"))
            result = launch(spec, workdir=folder, timeout_s=settings.trial_timeout_s)
            rate = result.samples_per_second if result.feasible else None
            print(json.dumps({"round": round_number, "config": name, "status": result.status, "rate": rate}))
            if rate:
                values[name].append(rate)
    return values


def report(result_path: str, winner: TrialConfig, values: dict[str, list[float]], load: tuple[float, ...]) -> str:
    reference = statistics.median(values["winner"]) if values["winner"] else 0.0
    spread = (max(values["winner"]) - min(values["winner"])) / reference if len(values["winner"]) > 1 else 0.0
    lines = [
        f"# Knob ablation of {Path(result_path).name}: {winner.short()}",
        "",
        f"`.venv/bin/python benchmarks/ablation.py {result_path} ...`, {dt.date.today()}, load average at the start "
        f"{load[0]:.1f}. Each row is the winner with one knob set back to the recipe baseline's value; ratio = its "
        f"median over the winner's, from the same interleaved rounds. The winner's own windows spread {spread:.0%}: a "
        "ratio closer to 1 than that is not resolved here.",
        "",
        "| configuration | samples/s (median) | windows | ratio to the winner | throughput lost when set back |",
        "|---|---|---|---|---|",
    ]
    for name, rates in values.items():
        median = statistics.median(rates) if rates else 0.0
        ratio = median / reference if reference else 0.0
        share = "" if name == "winner" else f"{1 - ratio:.0%}" if rates else "failed"
        lines.append(f"| {name} | {median:.2f} | {len(rates)} | {ratio:.2f} | {share} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a result YAML written by autotune run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds: every configuration once each")
    parser.add_argument("--data", default=None, help="the run's --data (default: the embedded corpus)")
    parser.add_argument("--space", default=None, help="the run's --space (default: the model's built-in space)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    args = parser.parse_args()
    tuned = load_config(args.result)
    model = tuned.workload["name"]
    with tempfile.TemporaryDirectory() as scratch:
        request = RunRequest(
            model=model,
            data=args.data,
            space=args.space,
            results_dir=scratch,
            device=tuned.device_type,
            devices=tuned.config.world_size,
            settings=TunerSettings(),
            warm_start=False,
        )
        plan = runner.prepare(request)
        configs = {"winner": tuned.config, **flips(tuned.config, baseline_config(plan))}
        print(f"{len(configs) - 1} knobs differ from the recipe baseline: {', '.join(list(configs)[1:])}")
        load = os.getloadavg()
        values = measure(configs, plan, args.rounds, Path(scratch) / "trials")
    text = report(args.result, tuned.config, values, load)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
