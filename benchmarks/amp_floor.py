"""How far chaotic training strays by chance, and how often the AMP check's floor rule rejects a precision for it.

The AMP check (autotune/trial/amp_check.py) trains a few steps in fp32 and in each autocast precision from the same
weights on the same batches; where training is chaotic (a recipe's peak learning rate from the first step), a curve
strays from fp32's by chance, and a precision is allowed floor_margin times as far as fp32 itself strays from
rounding-sized weight noise, the most of up to floor_runs perturbed runs. This measures that chance on the real
workload, in the check's own settings: FP32 curves from initial weights with a fresh rounding-sized noise each, and
AMP curves of the precision from their own perturbed starts (so that each is one more machine's draw), each curve's
deviation from the unperturbed fp32 reference as the check computes it. Under "the precision trains like fp32",
a rule (runs, margin) rejects it when all its runs strayed less than the precision's deviation / margin: with the
two samples' empirical distributions that probability is exact, mean over the precision's draws of F(d / m) ** runs.

    .venv/bin/python benchmarks/amp_floor.py --fp32-draws 24 --amp-draws 8 --out benchmarks/results/amp_floor-cpu.md

On this CPU (CAM++, batch 4, 20 steps) a curve costs about 12 s: the default draws take about 7 minutes.
"""

from __future__ import annotations

import argparse
import bisect
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune import yamlio  # noqa: E402
from autotune.data import default_source  # noqa: E402
from autotune.knobs.config import TrialConfig  # noqa: E402
from autotune.machine.hardware import probe  # noqa: E402
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.amp_curves import AmpCheckSettings, CurveRunner, compare_curves  # noqa: E402
from benchmarks.tables import markdown_table, publish  # noqa: E402

RULES = ((1, 1.5), (1, 2.0), (2, 2.0), (3, 1.5), (3, 2.0), (3, 2.5))  # (floor runs, margin); (1, 1.5) until 2026-11-28


def rejection_rate(fp32: Sequence[float], amp: Sequence[float], runs: int, margin: float) -> float:
    """P(every one of `runs` fp32 draws strays less than an AMP draw / margin), on the empirical distributions."""
    floors = sorted(fp32)
    return statistics.fmean((bisect.bisect_left(floors, d / margin) / len(floors)) ** runs for d in amp)


def _describe(values: Sequence[float]) -> str:
    ordered = sorted(values)
    return (
        f"{len(ordered)} curves: median {statistics.median(ordered):.1%}, {ordered[0]:.1%}-{ordered[-1]:.1%}, "
        f"spread of the log {statistics.stdev(math.log(v) for v in ordered):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cam++")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where there is one")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--fp32-draws", type=int, default=24)
    parser.add_argument("--amp-draws", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="also write the table here (markdown, + .json)")
    args = parser.parse_args()
    device = args.device or probe("auto").device_type
    settings = AmpCheckSettings()
    with tempfile.TemporaryDirectory() as folder:
        data_file = str(yamlio.write_json(Path(folder) / "data.json", default_source().to_dict()))
        trial = TrialSpec(
            workload=args.workload,
            workload_options={},
            data_file=data_file,
            config=TrialConfig(per_device_batch_size=settings.batch_size),
            timing=TimingSettings(),
            device_type=device,
            result_path=str(Path(folder) / "result.json"),
        )
        runner = CurveRunner(trial, settings)
        reference = runner.curve("fp32")

        def deviation(precision: str, draw: int | None) -> float:
            perturbation = 0.0 if draw is None else settings.perturbation
            losses = runner.curve(precision, perturbation=perturbation, draw=draw or 0)
            found = compare_curves(reference, losses, settings.smoothing_steps)[0]
            print(f"{precision} draw {draw}: strays {found:.1%}", flush=True)
            return found

        # draws far from the check's own (0, 1, 2): these are other machines' chances, not the check's
        fp32 = [deviation("fp32", 1000 + k) for k in range(args.fp32_draws)]
        amp = [deviation(args.precision, None)] + [deviation(args.precision, 2000 + k) for k in range(args.amp_draws)]
    rows = [
        {
            "perturbed runs": runs,
            "margin": f"{margin:g}x",
            f"{args.precision} rejected (of its draws)": f"{rejection_rate(fp32, amp, runs, margin):.1%}",
            "shipped": "yes" if (runs, margin) == (settings.floor_runs, settings.floor_margin) else "",
        }
        for runs, margin in RULES
    ]
    lines = markdown_table(rows)
    lines += [
        "",
        f"fp32 from perturbed weights: {_describe(fp32)}",
        f"{args.precision} (unperturbed first, then from perturbed weights): {_describe(amp)}",
        f"{args.workload} on {device}, the check's settings (batch {settings.batch_size}, {settings.steps} steps)",
    ]
    publish(lines, args.out, {"fp32": fp32, args.precision: amp})


if __name__ == "__main__":
    main()
