"""Against the peers: autotune beside the tools a user would pick instead, all re-measured by one neutral timer.

Each tool tunes the same workload (autotune's recipe pipeline: model, dataset, optimizer, loss) for the same wall-clock
budget, called as its own documentation says:

    autotune      `autotune run --model M --budget Nm`; the winner read back with load_config
    loadtune      its `tune()` API on a loadtune Workload wrapping the pipeline (peers_loadtune.py)
    ZenithTune    aibooster's CommandOutputTuner over peers_train.py's flags, the objective read from its log by regex
                  (peers_zenith.py)
    careful user  the rule applied by hand in a minute on a CPU (Lightning's BatchSizeFinder is for CUDA): bf16 where
                  the CPU has it, workers = cores per device, pinned memory and persistent workers, the recipe's batch

The peers run in their own virtualenv (benchmarks/.peers-venv, made here from PyPI on first use, never autotune's).
A tool that cannot express a knob does not tune it; a tool that cannot run here gets one line saying why.

Then every recommendation, the recipe's baseline and autotune's winner are trained by one plain loop
(peers_train.py) in fresh processes that only read the configuration, interleaved in rounds (each configuration
once per round, the order rotated), so that a change of load shifts them all alike; a tool's own figure is never
used. The table gives each configuration's per-round samples/s, median, spread, and ratios to the recipe and to
autotune, and is written to benchmarks/results/peers-DATE-HOST.md with the command that made it.

    .venv/bin/python benchmarks/peers.py --model cam++ --budget 5m --rounds 3
    .venv/bin/python benchmarks/peers.py --rehearse          # 4-minute budgets, one short round: ~25 min
    .venv/bin/python benchmarks/speech_corpus.py /tmp/speech && \
        .venv/bin/python benchmarks/peers.py --model cam++ --data /tmp/speech/train.csv   # real speech (espeak-ng)
    .venv/bin/python benchmarks/peers.py --model conformer --reuse KEPT   # re-measure a --keep run's recommendations

`--keep DIR` keeps the data list, every tool's recommendation and its tuning time (DIR/tools.json) and the logs;
`--reuse DIR` measures those recommendations again with the neutral timer, without tuning: the way to re-measure
after the timer changes, and to add rounds, with the tools' choices held fixed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of scripts, not a package

from autotune import load_config, yamlio  # noqa: E402
from autotune.run import runner  # noqa: E402
from autotune.run.plan import RunRequest  # noqa: E402
from autotune.search.settings import TunerSettings  # noqa: E402

BENCH = ROOT / "benchmarks"
PEERS_VENV = BENCH / ".peers-venv"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
PEER_PINS = ("loadtune==0.3.0", "aibooster==0.5.0")
# autotune's own runtime dependencies, so that the peers' workload can import autotune's pipeline (installed
# --no-deps); torch and torchaudio at autotune's venv's versions, from the same wheels.
AUTOTUNE_RUNTIME = (
    "optuna>=5",
    "pyyaml",
    "soundfile",
    "soxr",
    "numpy",
    "typer",
    "rich",
    "pandas",
    "nvidia-ml-py",
    "matplotlib",
    "imageio-ffmpeg",
)
LOADTUNE_TRIALS = 7  # its baseline plus max_trials=6, its default
ZENITH_TRIALS = 6  # trials a budget is sized for; more run if they fit


def log(message: str) -> None:
    print(f"[peers {dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def peers_venv() -> str | None:
    """Make (or reuse) the peers' virtualenv; None when it works, else why it does not."""
    import torch
    import torchaudio

    probe = "import loadtune, torch, autotune; from aibooster.intelligence import zenith_tune"
    if PEERS_PYTHON.exists() and subprocess.run([PEERS_PYTHON, "-c", probe], capture_output=True).returncode == 0:
        return None
    base = Path(sys.base_prefix) / "bin" / "python3"
    pip = [str(PEERS_PYTHON), "-m", "pip", "install", "-q"]
    steps = [
        [str(base), "-m", "venv", str(PEERS_VENV)],
        [
            *pip,
            f"torch=={torch.__version__.split('+')[0]}",
            f"torchaudio=={torchaudio.__version__.split('+')[0]}",
            *PEER_PINS,
        ],
        [*pip, "--no-deps", "-e", str(ROOT)],
        [*pip, *AUTOTUNE_RUNTIME],
    ]
    for step in steps:
        log("peers venv: " + shlex.join(step))
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return f"`{shlex.join(step[-3:])}` failed: {done.stderr.strip().splitlines()[-1:]}"
        if step[1:3] == ["-m", "venv"]:
            (PEERS_VENV / ".gitignore").write_text("*\n", encoding="utf-8")  # a local build, never committed
    failed = subprocess.run([PEERS_PYTHON, "-c", probe], capture_output=True, text=True)
    return None if failed.returncode == 0 else f"the peers venv cannot import them: {failed.stderr.strip()[-200:]}"


def recipe_plain(plan: Any) -> dict[str, Any]:
    """The recipe baseline as autotune fits it to this machine, as a plain setting."""
    from autotune.knobs.config import TrialConfig

    params = {**plan.space.fixed, **plan.space.baseline}
    config = TrialConfig.from_params(params, world_size=plan.world_size, workload_knobs=tuple(plan.workload.knobs))
    return {
        "batch_size": config.per_device_batch_size,
        "num_workers": config.num_workers,
        "prefetch_factor": config.prefetch_factor if config.num_workers else None,
        "persistent_workers": config.persistent_workers,
        "pin_memory": config.pin_memory,
        "threads": config.intra_op_threads,
        "precision": config.precision,
    }


def changes(plain: dict[str, Any], recipe: dict[str, Any]) -> str:
    def shown(value: Any) -> Any:
        return "default" if value is None else value  # None: torch's own default (all cores, its prefetch)

    differ = [
        f"{key} {shown(recipe.get(key))}->{shown(value)}" for key, value in plain.items() if value != recipe.get(key)
    ]
    return ", ".join(differ) or "nothing"


def run_logged(argv: list[str], log_path: Path, timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """Run a tool with its output in a log; None when it exited 0, else one line saying why."""
    log(f"{shlex.join(argv)}  (log {log_path})")
    with log_path.open("w", encoding="utf-8") as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return f"did not finish within {timeout_s / 60:.0f} min"
    if done.returncode == 0:
        return None
    tail = [line for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f"exit {done.returncode}: {tail[-1][:160] if tail else 'no output'}"


def tune_autotune(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "autotune.yaml"
    argv = [
        str(ROOT / ".venv/bin/autotune"),
        "run",
        "--model",
        args.model,
        "--budget",
        f"{args.budget_min}m",
        "--results-dir",
        str(work / "autotune-results"),
        "--out",
        str(out),
        "--no-warm-start",
        *(["--data", args.data] if args.data else []),
    ]
    started = time.monotonic()
    failed = run_logged(argv, work / "autotune.log", args.budget_min * 60 + 900)
    if failed or not out.exists():
        return {"error": failed or "wrote no result"}
    tuned = load_config(out)
    return {
        "config": str(out),
        "tuning_s": time.monotonic() - started,
        "changed": tuned.config.short(),
        "recipe_sps": tuned.baseline.samples_per_second,
        "command": shlex.join(argv),
        # its own figure, to be set beside the neutral timer's ratio (they must agree within the spread)
        **({"note": f"its own figure {speedup:.2f}x"} if (speedup := tuned.metrics.get("speedup")) else {}),
    }


def from_loadtune(knobs: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    return {
        "batch_size": knobs.get("batch_size") or recipe["batch_size"],
        "num_workers": knobs.get("num_workers", 0),
        "prefetch_factor": knobs.get("prefetch_factor") if knobs.get("num_workers") else None,
        "persistent_workers": bool(knobs.get("persistent_workers")) and bool(knobs.get("num_workers")),
        "pin_memory": bool(knobs.get("pin_memory")),
        "threads": knobs.get("num_threads"),
        "precision": "bf16" if knobs.get("amp") else "fp32",  # loadtune's AMP on a CPU is bf16 autocast
        **({"compile": True} if knobs.get("compile") else {}),
    }


def peer_env(args: argparse.Namespace, data_file: Path, recipe: dict[str, Any]) -> dict[str, str]:
    return {
        **os.environ,
        "PEERS_MODEL": args.model,
        "PEERS_DATA_FILE": str(data_file),
        "PEERS_BATCH": str(recipe["batch_size"]),
        "PEERS_OPTIONS": "{}",
    }


def tune_loadtune(args: argparse.Namespace, work: Path, data_file: Path, recipe: dict[str, Any], step_s: float):
    # Its tune() counts steps, not time: the steps that fill the budget over its trials at the recipe's step time.
    steps = max(2, int(args.budget_min * 60 / (LOADTUNE_TRIALS * step_s * 1.1)))
    out = work / "loadtune.json"
    argv = [str(PEERS_PYTHON), str(BENCH / "peers_loadtune.py"), "--steps", str(steps), "--out", str(out)]
    failed = run_logged(argv, work / "loadtune.log", args.budget_min * 60 * 4 + 300, peer_env(args, data_file, recipe))
    if failed:
        return {"error": failed}
    found = json.loads(out.read_text(encoding="utf-8"))
    plain = from_loadtune(found["knobs"], recipe)
    return {
        "plain": plain,
        "tuning_s": found["tuning_s"],
        "changed": changes(plain, recipe),
        "note": f"{steps} steps per trial; its own figure {found['own_speedup']:.2f}x",
    }


def tune_zenith(args: argparse.Namespace, work: Path, data_file: Path, recipe: dict[str, Any], step_s: float):
    # 1.4: its warm-up and start-up; one timed step at least, so that a short budget still finishes a trial
    steps = max(1, int(args.budget_min * 60 / (ZENITH_TRIALS * step_s * 1.4)))
    out = work / "zenith.json"
    space_recipe = {k: recipe[k] for k in ("batch_size", "num_workers", "threads", "prefetch_factor")}
    space_recipe["threads"] = space_recipe["threads"] or os.cpu_count()
    argv = [
        str(PEERS_PYTHON),
        str(BENCH / "peers_zenith.py"),
        "--budget-s",
        str(args.budget_min * 60),
        "--steps",
        str(steps),
        "--model",
        args.model,
        "--data-file",
        str(data_file),
        "--recipe",
        json.dumps(space_recipe),
        "--workdir",
        str(work / "zenith-outputs"),
        "--out",
        str(out),
    ]
    failed = run_logged(argv, work / "zenith.log", args.budget_min * 60 * 3 + 300, peer_env(args, data_file, recipe))
    if failed:
        return {"error": failed}
    found = json.loads(out.read_text(encoding="utf-8"))
    if not found["knobs"]:
        return {"error": f"no trial of {found['trials']} finished within the budget"}
    plain = {**recipe, **found["knobs"]}
    if not plain.get("num_workers"):
        plain["prefetch_factor"] = None
    return {
        "plain": plain,
        "tuning_s": found["tuning_s"],
        "changed": changes(plain, recipe),
        "note": f"{found['trials']} trials of {steps} steps",
    }


def careful_user(recipe: dict[str, Any]) -> dict[str, Any]:
    import torch

    bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    plain = {
        **recipe,
        "num_workers": os.cpu_count() or 1,
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": recipe.get("prefetch_factor") or 2,
        "precision": "bf16" if bf16 else recipe["precision"],
    }
    return {"plain": plain, "tuning_s": 60.0, "changed": changes(plain, recipe), "note": "by hand, about a minute"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Reading:
    """One neutral measurement: its round, samples/s, and the CPU share other processes took meanwhile."""

    round: int
    rate: float
    others: float | None


def measure(configs: dict[str, str], args: argparse.Namespace, data_file: Path, work: Path) -> dict[str, list[Reading]]:
    """Every configuration once per round in a fresh process, the order rotated each round."""
    values: dict[str, list[Reading]] = {name: [] for name in configs}
    names = list(configs)
    for round_number in range(args.rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in order:
            argv = [
                str(ROOT / ".venv/bin/python"),
                str(BENCH / "peers_train.py"),
                "--model",
                args.model,
                "--data-file",
                str(data_file),
                "--config",
                configs[name],
                "--seconds",
                str(args.seconds),
                "--warmup-steps",
                str(args.warmup_steps),
            ]
            log_path = work / f"neutral-r{round_number}-{names.index(name)}.log"
            # a sort window's samples at 0.25 samples/s at worst, or twenty times the timed seconds
            failed = run_logged(argv, log_path, max(args.seconds * 20, span_samples(args) * 4) + 600)
            lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            measured = [json.loads(line) for line in lines if line.startswith("{")]
            if failed or not measured:
                log(f"round {round_number} {name}: {failed or 'no figure'}")
                continue
            reading = Reading(
                round=round_number,
                rate=measured[-1]["samples_per_second"],
                others=measured[-1].get("others_cpu_fraction"),
            )
            values[name].append(reading)
            log(f"round {round_number} {name}: {reading.rate:.2f} samples/s, others {reading.others}")
    return values


def span_samples(args: argparse.Namespace) -> int:
    """Samples of one neutral measurement where the workload is length-sorted (peers_train.py), else 0: seconds."""
    import peers_train

    return peers_train.sort_window(args.model, {})


def median(rates: list[float]) -> float:
    return statistics.median(rates) if rates else 0.0


def paired_ratio(mine: list[Reading], reference: list[Reading]) -> str:
    """The median over rounds of the ratio within each round (both measured in it): a round's load falls on both."""
    theirs = {reading.round: reading.rate for reading in reference}
    ratios = [reading.rate / theirs[reading.round] for reading in mine if theirs.get(reading.round)]
    return f"{statistics.median(ratios):.2f}x" if ratios else "-"  # no round in common: no ratio


def shown(reading: Reading) -> str:
    """A rate, with the share others took where it is a busy one (autotune's BUSY_OTHERS_FRACTION)."""
    from autotune.machine.cpu_load import BUSY_OTHERS_FRACTION

    busy = reading.others is not None and reading.others >= BUSY_OTHERS_FRACTION
    return f"{reading.rate:.2f}" + (f" (others {reading.others:.0%})" if busy else "")


def table(tools: dict[str, dict[str, Any]], values: dict[str, list[Reading]]) -> list[str]:
    recipe, ours = values.get("recipe", []), values.get("autotune", [])
    lines = [
        "| tool | tuning wall time | what it changed | samples/s per round | median samples/s | ratio to recipe "
        "| ratio to autotune | spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, tool in tools.items():
        if "error" in tool:
            lines.append(f"| {name} | - | no recommendation: {tool['error']} | - | - | - | - | - |")
            continue
        readings = values.get(name, [])
        rates = [reading.rate for reading in readings]
        mid = median(rates)
        spread = (max(rates) - min(rates)) / mid if len(rates) > 1 and mid else 0.0
        wall = f"{tool['tuning_s'] / 60:.1f} min" if tool.get("tuning_s") else "-"
        note = f" ({tool['note']})" if tool.get("note") else ""
        lines.append(
            f"| {name} | {wall} | {tool['changed']}{note} | {', '.join(map(shown, readings)) or 'failed'} | "
            f"{mid:.2f} | {paired_ratio(readings, recipe)} | {paired_ratio(readings, ours)} | {spread:.0%} |"
        )
    return lines


def report(
    args: argparse.Namespace,
    tools: dict[str, dict[str, Any]],
    values: dict[str, list[Reading]],
    load: tuple[tuple[float, ...], tuple[float, ...]],
    started: dt.datetime,
) -> str:
    import torch

    command = ".venv/bin/python benchmarks/peers.py " + shlex.join(sys.argv[1:])
    span = span_samples(args)
    timed = (
        f"one sort window of {span} samples timed (a length-sorted workload: a span of seconds would time whichever "
        "clip lengths it reached)"
        if span
        else f"{args.seconds:g} s timed"
    )
    reused = ""
    if args.reuse:
        reused = f" The recommendations are those a run kept in {args.reuse} (its tools.json), measured again."
    lines = [
        f"# Against the peers: {args.model} on {args.data or 'the embedded corpus'}, {args.budget_min} min per tool, "
        f"{args.rounds} neutral round(s)",
        "",
        f"`{command}`, started {started:%Y-%m-%d %H:%M}, on {platform.node()} ({os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}); load average "
        f"{load[0][0]:.1f} at the start, {load[1][0]:.1f} at the end. Every samples/s figure is the neutral loop's "
        f"(benchmarks/peers_train.py: {args.warmup_steps} untimed steps, then {timed}, end to end), "
        "one fresh process per configuration and round, interleaved, the order rotated each round; a ratio is the "
        "median over rounds of the two configurations' ratio within the round (paired: a round's load falls on both); "
        "spread = (max - min) / median over the rounds; where other processes took 20% or more of the CPU during a "
        f"measurement, its share is given beside it.{reused}",
        "",
        *table(tools, values),
        "",
    ]
    lines += [f"- {name}: `{tool['command']}`" for name, tool in tools.items() if tool.get("command")]
    return "\n".join(lines) + "\n"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cam++", help="an autotune workload (cam++, conformer, ...)")
    parser.add_argument(
        "--data",
        default=None,
        help="the workload's data as `autotune run --data` takes it (default: "
        "the embedded corpus); benchmarks/speech_corpus.py makes real speech",
    )
    parser.add_argument("--budget", default="5m", help="wall-clock budget per tool, in minutes: 5m")
    parser.add_argument("--rounds", type=int, default=3, help="neutral rounds: every configuration once each")
    parser.add_argument("--seconds", type=float, default=60.0, help="timed seconds of each neutral measurement")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps before each neutral measurement")
    parser.add_argument("--rehearse", action="store_true", help="4-minute budgets, one round of 5 s: a quick check")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/peers-DATE-HOST.md")
    parser.add_argument("--keep", type=Path, default=None, help="keep the tools' logs and configs in this folder")
    parser.add_argument(
        "--reuse", type=Path, default=None, help="measure the recommendations a --keep folder holds again, no tuning"
    )
    args = parser.parse_args()
    if args.rehearse:
        # 4m: autotune reports nothing until its baseline trial finishes, and on a loaded 2-core CPU its checks and
        # that trial outlast 1m and 2m budgets; every tool gets the same budget, so all get 4m
        args.budget, args.rounds, args.seconds, args.warmup_steps = "4m", 1, 5.0, 2
    args.budget_min = int(args.budget.rstrip("m"))
    if args.reuse and not (args.reuse / "tools.json").is_file():
        parser.exit(2, f"error: --reuse {args.reuse}: no tools.json there; give a folder a run kept with --keep\n")
    if args.reuse and args.keep and args.reuse.resolve() == args.keep.resolve():
        parser.exit(2, "error: --reuse and --keep name the same folder; keep the new logs in another one\n")
    return args


def tune_all(args: argparse.Namespace, work: Path, data_file: Path, recipe: dict[str, Any]) -> dict[str, dict]:
    tools: dict[str, dict[str, Any]] = {"recipe": {"plain": recipe, "changed": "the recipe's baseline", "tuning_s": 0}}
    log("autotune ...")
    tools["autotune"] = tune_autotune(args, work)
    # The peers size their step-counted trials from the recipe's step time, as autotune measured it (10 s if not).
    recipe_sps = tools["autotune"].get("recipe_sps") or 0.0
    step_s = recipe["batch_size"] / recipe_sps if recipe_sps else 10.0
    why = peers_venv()
    for name, tune in (("loadtune", tune_loadtune), ("ZenithTune", tune_zenith)):
        log(f"{name} ...")
        tools[name] = {"error": why} if why else tune(args, work, data_file, recipe, step_s)
        log(f"{name}: {tools[name]}")
    tools["careful user"] = careful_user(recipe)
    return tools


def main() -> None:
    args = parse()
    started = dt.datetime.now()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="peers-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        if args.reuse:
            data_file = args.reuse / "data.json"
            tools = json.loads((args.reuse / "tools.json").read_text(encoding="utf-8"))
        else:
            data_file, tools = tune(args, work)
        values = measure(recommendations(tools, work), args, data_file, work)
    text = report(args, tools, values, (load_start, os.getloadavg()), started)
    out = args.out or BENCH / "results" / f"peers-{started:%Y-%m-%d}-{platform.node()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(text)
    log(f"written to {out}")


def tune(args: argparse.Namespace, work: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The data list and every tool's recommendation, kept in work (data.json, tools.json)."""
    request = RunRequest(
        model=args.model,
        data=args.data,
        space=None,
        results_dir=str(work / "plan"),
        device="cpu",
        devices=1,
        settings=TunerSettings(),
        warm_start=False,
    )
    plan = runner.prepare(request)  # the workload's options checked and its synthetic augmentation made
    runner.prepare_data(plan)  # the recipe's one-off preparation (the conformer's CMVN), as a run does it
    data_file = yamlio.write_json(work / "data.json", plan.data.to_dict())
    tools = tune_all(args, work, data_file, recipe_plain(plan))
    yamlio.write_json(work / "tools.json", tools)
    return data_file, tools


def recommendations(tools: dict[str, dict[str, Any]], work: Path) -> dict[str, str]:
    """Each tool's recommendation as the file the neutral loop reads: a plain JSON, or autotune's result."""
    configs: dict[str, str] = {}
    for name, tool in tools.items():
        if "plain" in tool:
            path = work / f"{name.replace(' ', '-')}.json"
            path.write_text(json.dumps(tool["plain"]), encoding="utf-8")
            configs[name] = str(path)
        elif "config" in tool:
            configs[name] = tool["config"]
    return configs


if __name__ == "__main__":
    main()
