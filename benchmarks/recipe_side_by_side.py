"""autotune's built-in ECAPA-TDNN beside SpeechBrain's own training of the same network on the same data, side by side
in one run: the evidence that the built-in workload costs what the framework's training costs.

For each configuration (batch, workers, precision), in every round, in alternating order:
- **built-in**: a trial of autotune's `ecapa-tdnn` workload (its SpeechBrain-faithful ECAPA-TDNN, C=1024, embedding
  192, 80 mels, 3-second crops, Adam, additive angular margin), with `augment_copies=0` (its fbank then computed
  where the pipeline puts it without augmentation: in the DataLoader's workers, or the main process without any);
- **SpeechBrain**: `examples/speechbrain_recipe` (a Brain subclass in the layout of SpeechBrain's VoxCeleb recipe,
  trained by SpeechBrain's own Brain.fit, DynamicItemDataset, read_audio and Fbank), its hparams overridden to the
  recipe's network (channels [1024, 1024, 1024, 1024, 3072], attention 128, embedding 192, 80 mels, 3-second crops),
  run as `autotune run --recipe speechbrain` runs a trial: SpeechBrain's own overrides, under the probe.
Both read the embedded synthetic corpus (16 kHz WAV) and time a steady window with the same rules. What the two do
not share, and so what a difference can come from: the built-in crops from a decoded buffer in its dataset while
SpeechBrain's pipeline decodes with torchaudio and crops in its dynamic item; SpeechBrain computes its fbank in the
training step (with workers, the built-in computes it in them); SpeechBrain's Brain adds its
bookkeeping per step (the running loss average, the progress bar, the checkpoint-interval check); neither augments.

    .venv/bin/python benchmarks/recipe_side_by_side.py --rounds 2 --window 20
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from autotune import data as data_module
from autotune import workloads, yamlio
from autotune.exports.recipes import recipe_command
from autotune.knobs.config import TrialConfig
from autotune.probe.launcher import CommandLauncher
from autotune.trial import TimingSettings, TrialSpec, launch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "speechbrain_recipe"
# The VoxCeleb recipe's network (recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml), as SpeechBrain overrides.
NETWORK = [
    "--channels",
    "[1024, 1024, 1024, 1024, 3072]",
    "--attention_channels",
    "128",
    "--emb_dim",
    "192",
    "--n_mels",
    "80",
    "--sentence_len",
    "3.0",
]
CONFIGS = {
    "bs16 w0 fp32": TrialConfig(per_device_batch_size=16, num_workers=0, precision="fp32-default"),
    "bs16 w1 bf16": TrialConfig(
        per_device_batch_size=16, num_workers=1, prefetch_factor=2, persistent_workers=True, precision="bf16"
    ),
}


def _builtin(config: TrialConfig, data_file: Path, timing: TimingSettings, folder: Path) -> float:
    spec = TrialSpec(
        workload="ecapa-tdnn",
        workload_options={**workloads.get("ecapa-tdnn").options, "augment_copies": 0},
        data_file=str(data_file),
        config=config,
        timing=timing,
        device_type="cpu",
        result_path=str(folder / "result.json"),
    )
    result = launch(spec, workdir=folder, timeout_s=900)
    return result.samples_per_second if result.status == "ok" and result.samples_per_second else float("nan")


def _speechbrain(config: TrialConfig, project: Path, timing: TimingSettings, folder: Path, speakers: int) -> float:
    template = " ".join([sys.executable, "train.py", "hparams/train_ecapa_tdnn.yaml", "--data_folder", "data"])
    template += " " + " ".join(f"'{word}'" if " " in word else word for word in NETWORK)
    template += f" --out_n_neurons {speakers}"
    command, _ = recipe_command("speechbrain", template, cwd=str(project))
    spec = TrialSpec(
        workload="command",
        workload_options={},
        data_file="",
        config=config,
        timing=timing,
        device_type="cpu",
        result_path=str(folder / "result.json"),
    )
    result = CommandLauncher(command=command)(spec, workdir=folder, timeout_s=900)
    if result.status != "ok":
        print(f"  SpeechBrain trial: {result.status}: {result.reason}", file=sys.stderr)
    return result.samples_per_second if result.status == "ok" and result.samples_per_second else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady steps per trial")
    parser.add_argument("--out", type=Path, default=None, help="the markdown report (default benchmarks/results/)")
    args = parser.parse_args()
    source = data_module.default_source()
    timing = TimingSettings(window_s=args.window, max_throughput_cv=None)
    rates: dict[tuple[str, str], list[float]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as temp:
        work = Path(temp)
        data_file = yamlio.write_json(work / "data.json", workloads.get("ecapa-tdnn").load_data(None).to_dict())
        project = work / "recipe"
        project.mkdir()
        for path in ("train.py", "hparams"):
            target = project / path
            if (RECIPE / path).is_dir():
                target.mkdir()
                for item in (RECIPE / path).iterdir():
                    (target / item.name).write_text(item.read_text())
            else:
                target.write_text((RECIPE / path).read_text())
        (project / "data").symlink_to(Path(source.path))
        for round_index in range(args.rounds):
            for name, config in CONFIGS.items():
                order = ["built-in", "SpeechBrain"] if round_index % 2 == 0 else ["SpeechBrain", "built-in"]
                for system in order:
                    folder = work / f"r{round_index}-{name.replace(' ', '_')}-{system}"
                    if system == "built-in":
                        rate = _builtin(config, data_file, timing, folder)
                    else:
                        rate = _speechbrain(config, project, timing, folder, len(source.speakers))
                    rates.setdefault((name, system), []).append(rate)
                    print(f"round {round_index + 1} {name} {system}: {rate:.2f} samples/s", flush=True)
    lines = [
        f"# Built-in ECAPA-TDNN beside SpeechBrain's own training ({date.today()}, {platform.node()}, CPU)",
        "",
        f"`.venv/bin/python benchmarks/recipe_side_by_side.py --rounds {args.rounds} --window {args.window:g}` "
        f"({(time.perf_counter() - started) / 60:.0f} min; SpeechBrain from PyPI, the recipe in "
        "examples/speechbrain_recipe at the network of recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml)",
        "",
        "| configuration | built-in samples/s (rounds) | SpeechBrain samples/s (rounds) | built-in / SpeechBrain |",
        "|---|---|---|---|",
    ]
    for name in CONFIGS:
        ours, theirs = rates[(name, "built-in")], rates[(name, "SpeechBrain")]
        ratio = statistics.median(ours) / statistics.median(theirs)
        lines.append(
            f"| {name} | {' / '.join(f'{v:.2f}' for v in ours)} | {' / '.join(f'{v:.2f}' for v in theirs)} | "
            f"{ratio:.2f} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    out = args.out or ROOT / "benchmarks" / "results" / f"recipe-side-by-side-{date.today()}.md"
    out.write_text(report)


if __name__ == "__main__":
    main()
