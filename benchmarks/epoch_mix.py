"""A short window's rate against whole epochs', for a workload whose utterances differ in length (trial/epoch_mix.py).

Real conformer trials on this machine (each its own subprocess, as `autotune run` measures them) over a generated
corpus of 1-5 s clips (WeNet issue #2661's short clips), in WeNet's length-sorted batches:

- a reference: one trial whose window is two whole epochs (its mix is the epoch's), before and after the rest;
- short trials as a run measures them (a window of --window-s), one per shuffle (the trial's seed: which stretch of
  the sorted epoch the window reaches).

Each short trial shows its window's own rate (the objective without the epoch's mix priced) and the objective (window
rate x epoch_mix_factor), each against the references' mean. A machine's own noise (5-8% on this 2-core CPU) is in every
row alike; the spread across shuffles and the error against the reference are what the mix adds:

    .venv/bin/python benchmarks/epoch_mix.py --out benchmarks/results/epoch_mix-cpu.md
    .venv/bin/python benchmarks/epoch_mix.py --knobs '{"batch_type": "dynamic", "max_frames_in_batch": 4000}' \\
        --batch-size 1 --out benchmarks/results/epoch_mix-cpu-dynamic.md

About 8 minutes each on this CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import workloads, yamlio  # noqa: E402
from autotune.data import generate_corpus  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.trial import TimingSettings, TrialResult, TrialSpec, launch
from benchmarks.tables import markdown_table, publish  # noqa: E402

# The recipe's architecture, smaller (a CPU step of a fraction of a second at batch 8)
MODEL = {"output_size": 128, "attention_heads": 4, "linear_units": 512, "num_blocks": 4, "decoder_blocks": 2}


def _trial(data_file: Path, config: TrialConfig, timing: TimingSettings, seed: int, workdir: Path) -> TrialResult:
    spec = TrialSpec(
        workload="conformer",
        workload_options={"model": MODEL},
        data_file=str(data_file),
        config=config,
        timing=timing,
        device_type="cpu",
        result_path=str(workdir / "result.json"),
        seed=seed,
    )
    result = launch(spec, workdir=workdir, timeout_s=1800)
    if result.status != "ok":
        raise SystemExit(f"trial failed ({result.status}): {result.reason}\n{result.log_tail}")
    return result


def _epoch_batches(result: TrialResult) -> int:
    return int((result.epoch_accounting or {})["batches_per_epoch_per_rank"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1200, help="utterances in the generated corpus")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--knobs", default="{}", help="the conformer's workload knobs (JSON), e.g. dynamic batches")
    parser.add_argument("--window-s", type=float, default=8.0, help="the short trials' window, as a run's")
    parser.add_argument("--shuffles", type=int, default=6, help="short trials, one per seed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="epoch-mix-"))
    speakers = 12
    corpus = generate_corpus(
        work / "corpus",
        n_speakers=speakers,
        files_per_speaker=math.ceil(args.files / speakers),
        min_duration_s=1.0,
        max_duration_s=5.0,
        seed=3,
    )
    data_file = yamlio.write_json(work / "data.json", workloads.get("conformer").load_data(str(corpus)).to_dict())
    config = TrialConfig(per_device_batch_size=args.batch_size, num_workers=0, workload_knobs=json.loads(args.knobs))
    short = TimingSettings(window_s=args.window_s)

    # How many batches an epoch has: a short trial counts it (epoch_accounting), and is the first shuffle's row.
    results: list[tuple[int, TrialResult]] = [(0, _trial(data_file, config, short, 0, work / "short0"))]
    epoch = _epoch_batches(results[0][1])
    whole = TimingSettings(window_s=1.0, min_window_steps=2 * epoch, max_window_steps=2 * epoch, min_timed_share=0.0)
    references = [_trial(data_file, config, whole, 0, work / "reference0")]
    print(f"epoch of {epoch} batches; reference {references[0].samples_per_second:.2f} samples/s", flush=True)
    for seed in range(1, args.shuffles):
        results.append((seed, _trial(data_file, config, short, seed, work / f"short{seed}")))
        print(f"shuffle {seed}: {results[-1][1].window_samples_per_second:.2f} samples/s in the window", flush=True)
    references.append(_trial(data_file, config, whole, 0, work / "reference1"))
    reference = statistics.fmean(r.samples_per_second or 0.0 for r in references)

    rows: list[dict[str, Any]] = []
    for seed, result in results:
        raw, objective = result.window_samples_per_second or 0.0, result.samples_per_second or 0.0
        rows.append(
            {
                "shuffle": seed,
                "window steps": result.window_steps,
                "window (s)": f"{result.window_s:.1f}",
                "window samples/s": f"{raw:.2f}",
                "vs whole epochs": f"{raw / reference - 1:+.1%}",
                "epoch_mix_factor": f"{result.epoch_mix_factor:.3f}" if result.epoch_mix_factor else "-",
                "objective samples/s": f"{objective:.2f}",
                "objective vs whole epochs": f"{objective / reference - 1:+.1%}",
            }
        )

    def spread(values: list[float]) -> str:
        return f"{statistics.stdev(math.log(v) for v in values):.1%}"

    def error(values: list[float]) -> str:
        return f"{statistics.fmean(abs(v / reference - 1) for v in values):.1%}"

    raws = [r.window_samples_per_second or 0.0 for _, r in results]
    objectives = [r.samples_per_second or 0.0 for _, r in results]
    lines = markdown_table(rows)
    lines += [
        "",
        f"Conformer ({MODEL}), batch {args.batch_size} {args.knobs}, {len(results)} shuffles, a {args.window_s:g}-s "
        f"window; an epoch of {epoch} batches. Whole epochs (two, twice, seed 0): "
        + ", ".join(f"{r.samples_per_second:.2f}" for r in references)
        + f" samples/s (factor {', '.join(f'{r.epoch_mix_factor:.3f}' for r in references if r.epoch_mix_factor)}).",
        f"Spread across shuffles (sd of log): window {spread(raws)}, objective {spread(objectives)}. Mean error "
        f"against whole epochs: window {error(raws)}, objective {error(objectives)}.",
    ]
    publish(
        lines,
        args.out,
        {
            "references": [r.to_dict() | {"log_tail": ""} for r in references],
            "short": [r.to_dict() | {"log_tail": "", "seed": seed} for seed, r in results],
        },
    )


if __name__ == "__main__":
    main()
