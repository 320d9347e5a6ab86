"""autotune's built-in workload beside the framework's own training of the same network on the same data, side by
side in one run: the evidence that the built-in workload costs what the framework's training costs.

For each configuration (batch, workers, precision), in every round, in alternating order, a trial of the built-in
workload (`autotune.trial.launch`) and a trial of the framework's own training run as `autotune run --recipe NAME`
runs one (`recipe_command` + `CommandLauncher`: the framework's own arguments, under the probe). Both read the same
audio and time a steady window with the same rules. `--system` picks the pair.

**ecapa**: the built-in `ecapa-tdnn` (its SpeechBrain-faithful ECAPA-TDNN, C=1024, embedding 192, 80 mels, 3-second
crops, Adam, additive angular margin) with `augment_copies=0` (its SpeechBrain Fbank still computed in the training
step, as the recipe's compute_forward computes it), beside `examples/speechbrain_recipe` (a Brain subclass in the
layout of SpeechBrain's VoxCeleb recipe, trained by SpeechBrain's own Brain.fit, DynamicItemDataset, read_audio and
Fbank), its hparams overridden to the recipe's network (channels [1024, 1024, 1024, 1024, 3072], attention 128,
embedding 192, 80 mels, 3-second crops), on the embedded synthetic corpus. What they do not share: the built-in crops
from a decoded buffer in its dataset while SpeechBrain's pipeline decodes with torchaudio and crops in its dynamic
item; SpeechBrain's Brain adds its bookkeeping per step (the running loss average, the progress bar, the
checkpoint-interval check); the Fbank's code (SpeechBrain's Fbank module against the built-in's re-implementation of
it, tests/data/test_augment.py compares them); neither augments.

**conformer**: the built-in `conformer` (WeNet's aishell conformer: 12 conformer blocks, attention 256, 4 heads, 2048
units, 6 transformer decoder blocks, CTC weight 0.3, label smoothing 0.1, Adam with WarmupLR and clipping at 5) with
speed perturbation off, beside WeNet's own wenet/bin/train.py under torchrun (`--device cpu --ddp.dist_backend gloo`,
one rank) with the checkout's examples/aishell/s0/conf/train_conformer.yaml unchanged, read from `--wenet-root`, and
two overrides on its command: `dataset_conf.speed_perturb false` (WeNet perturbs with torchaudio.sox_effects, gone from
torchaudio 2.9) and `accum_grad 1` (the recipe's 4 would make one timed step four batches; the built-in steps every
batch). The corpus is synthetic, 2-second utterances, prepared by examples/wenet_recipe/prepare.py as run.sh's data
stages leave it (train and dev lists, char table, global CMVN); the built-in reads the same training list. Both train
fp32 (WeNet's autocast is CUDA's). Matched: the network, the loss, the optimiser and its per-step schedule and
clipping; the fbank settings (80 bins, 25/10 ms, dither 0.1) and SpecAugment's (2 time masks up to 50 frames, 2
frequency masks up to 10 bins), both computed per utterance in the DataLoader's workers, the fbank by
torchaudio.compliance.kaldi.fbank on both sides; the CMVN statistics (the same function over the same training list:
prepare.py's file for WeNet, autotune's cache for the built-in); the vocabulary (both the char table of `<blank>`,
`<unk>`, `<sos/eos>` and the characters, checked to have the same size: the script rewrites WeNet's from the training
text where a character only the dev list holds would make them differ). Both vocabularies are this corpus's few
characters, not aishell's 4233: the output layers are smaller than the published 46.2M parameters count. What they do
not share, and so what a difference can come from: the code itself (WeNet's encoder, decoder, CTC and loss modules
against autotune's re-implementation in autotune/models); the decoding (WeNet's torchaudio.load through torchcodec, the
built-in's soundfile); WeNet's dataset pipeline (a chain of iterable processors: parse, filter, resample, fbank,
SpecAugment, a 1500-utterance shuffle buffer, a 500-utterance sort buffer, static batches, padding) against autotune's
map-style dataset and length-sorted batch sampler; WeNet trains in a one-rank DistributedDataParallel over gloo (an
all-reduce of every gradient each step) and does per-step bookkeeping (the step timer, a log line every log_interval
steps, the tensorboard writer); at each epoch's end it runs the dev list and saves a checkpoint of the whole model (the
built-in only restarts its sampler). The probe counts the batches of every DataLoader a training iterates, so a WeNet
window holding an epoch's end would count the dev utterances as trained ones: the corpus is sized so that each WeNet
window ends inside the first epoch (the script says so when a window saw more batches than steps), and the dev pass,
the checkpoint and WeNet's short last batch (the built-in drops it) stay out of the figures. Both figures are each
window's own rate (samples over its seconds) and, less moved by one step another process disturbed, the batch over the
window's median step.

**cam++**: the built-in `cam++` (3D-Speaker's CAM++ as egs/voxceleb/sv-cam++/conf/cam++.yaml builds it: 80-bin fbank,
512-d embedding, its dense layers' memory_efficient checkpointing, a cosine classifier, ArcMarginLoss scale 32, SGD with
Nesterov momentum 0.9, weight decay 1e-4) with `speed_perturb: false`, beside speakerlab's own speakerlab/bin/train.py
(3D-Speaker's trainer, PyPI speakerlab 0.0.6) with the recipe's conf/cam++.yaml as tests/exports/recipes records it
(3D-Speaker 09e7806), unchanged, and one override on its command, `--speed_pertub False` (speakerlab speed-perturbs with
torchaudio.sox_effects, gone from torchaudio 2.9), under torch.distributed.run with one rank. train.py trains on CUDA
only, so the command runs the CPU port tests/exports/speakerlab_cpu.py, copied to cpu/speakerlab/bin/train.py in the
recipe folder (so that `--recipe 3d-speaker` takes it for train.py): it makes torch.cuda.set_device a no-op, gives
init_process_group gloo for nccl, lets Tensor.cuda and Module.cuda return what they are called on, and decodes
torchaudio.load's files with soundfile (torchaudio 2.11 reads through torchcodec, not installed here; the built-in
decodes with soundfile too), then calls speakerlab.bin.train.main() unchanged. The `--recipe 3d-speaker` input check
refuses the recipe's reader where torchaudio.load cannot read: this script tells it the port's stack (load works,
sox_effects as this torchaudio has it), for its own command only. Data: the embedded corpus written as the train.csv
run.sh's data stage leaves (ID,dur,path,start,stop,spk, one row a whole file), which both sides read; both decode the
whole file (speakerlab ignores start/stop), take a random 3-second crop (wav_len), zero-padded when shorter, and compute
an 80-bin Kaldi fbank (25/10 ms, no dither, mean-normalised) per item, in the DataLoader's workers or, without any, in
the main process. Augmentation on both, as the recipe has it: with probability 0.2 (aug_prob) noise, reverb or both,
from autotune's synthetic noise clips and room responses (autotune/data/synth_noise.py) listed in wav.scp files that
train.py gets as --noise and --reverb and the built-in as its noise and reverb options. Both train fp32 (train.py has no
AMP). The networks are counted on both sides (the report's notes). What they do not share: the code (speakerlab's
CAMPPlus, whose checkpointing is torch's reentrant variant, its default, against autotune's re-implementation with the
non-reentrant one); the reader (speakerlab's WavReader through the port's soundfile, the built-in's own); the
corruption's arithmetic, the same operations in other libraries (speakerlab's numpy and scipy.signal.convolve, which
pads its FFT to a fast length, against the built-in's torch ops and torchaudio's fftconvolve at the exact output length,
which can be far slower: the report measures it); train.py's schedules (WarmupCosineScheduler's learning rate and
MarginScheduler's margin, set every batch: margin 0 for its first 15 epochs, against the built-in's peak lr 0.1 and
final margin 0.2, arithmetic of the same cost); its one-rank DistributedDataParallel over gloo (a bucketed all-reduce of
every gradient each step); its per-step bookkeeping (loss.item(), top-1 accuracy, the average meters, a log line every
100 steps). An epoch is 125 steps at batch 16, more than a window holds; train.py has no validation pass and saves a
checkpoint at every 5th epoch's end, so neither falls inside a window.

    .venv/bin/python benchmarks/recipe_side_by_side.py --rounds 2 --window 20
    PYTHONPATH=/tmp/wenet_deps .venv/bin/python benchmarks/recipe_side_by_side.py --system conformer \
        --wenet-root /tmp/wenet --rounds 2 --window 15
    .venv/bin/python benchmarks/recipe_side_by_side.py --system cam++ --rounds 3 --window 20
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from autotune import data as data_module
from autotune import workloads, yamlio
from autotune.exports import recipe_input
from autotune.exports.recipes import recipe_command
from autotune.knobs.config import TrialConfig
from autotune.probe.command import TrainingCommand
from autotune.probe.launcher import CommandLauncher
from autotune.trial import TimingSettings, TrialResult, TrialSpec, launch

ROOT = Path(__file__).resolve().parents[1]
SPEECHBRAIN_RECIPE = ROOT / "examples" / "speechbrain_recipe"
WENET_PREPARE = ROOT / "examples" / "wenet_recipe" / "prepare.py"
# The VoxCeleb recipe's network (recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml), as SpeechBrain overrides.
ECAPA_NETWORK = [
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
AISHELL_CONFIG = "examples/aishell/s0/conf/train_conformer.yaml"
WENET_ARGS = (
    "wenet/bin/train.py --device cpu --ddp.dist_backend gloo --config conf/train_conformer.yaml --data_type raw "
    "--train_data data/train/data.list --cv_data data/dev/data.list --model_dir exp/conformer "
    "--override_config 'dataset_conf.speed_perturb false' --override_config 'accum_grad 1'"
)
# Utterances all 2 s long, so every batch costs the same and any stretch of an epoch is its average (as the speaker
# workloads' fixed crops): a step of the full-size conformer then takes seconds on a 2-core CPU. 448 of them form
# the training list (prepare.py puts every 8th in dev), an epoch of 28 steps at batch 16: each WeNet trial's window
# ends inside its first epoch, before the dev pass and checkpoint at the epoch's end (see the docstring).
CONFORMER_CORPUS = {"n_speakers": 8, "files_per_speaker": 64, "min_duration_s": 2.0, "max_duration_s": 2.0}
SPEAKERLAB_CPU = ROOT / "tests" / "exports" / "speakerlab_cpu.py"  # train.py on the CPU (see the docstring)
CAMPPLUS_CONFIG = ROOT / "tests" / "exports" / "recipes" / "3d-speaker_cam++.yaml"
SPEAKERLAB_ARGS = (
    "cpu/speakerlab/bin/train.py --config conf/cam++.yaml --gpu 0 --data data/train.csv --noise data/musan/wav.scp "
    "--reverb data/rirs/wav.scp --exp_dir exp/cam++ --speed_pertub False"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Pair:
    """What one system's trials need, once prepared: the built-in's workload and data, the framework's command."""

    workload: str
    options: dict[str, object]
    data_file: Path
    command: TrainingCommand
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class System:
    """A built-in workload and the framework whose own training it is set beside."""

    framework: str  # the column's name
    title: str
    provenance: str  # where the framework's side comes from, for the report
    report_stem: str
    configs: dict[str, TrialConfig]
    prepare: Callable[[Path, argparse.Namespace], Pair]


def _prepare_ecapa(work: Path, args: argparse.Namespace) -> Pair:
    source = data_module.default_source()
    workload = workloads.get("ecapa-tdnn")
    data_file = yamlio.write_json(work / "data.json", workload.load_data(None).to_dict())
    project = work / "recipe"
    project.mkdir()
    for path in ("train.py", "hparams"):
        target = project / path
        if (SPEECHBRAIN_RECIPE / path).is_dir():
            target.mkdir()
            for item in (SPEECHBRAIN_RECIPE / path).iterdir():
                (target / item.name).write_text(item.read_text())
        else:
            target.write_text((SPEECHBRAIN_RECIPE / path).read_text())
    (project / "data").symlink_to(Path(source.path))
    template = " ".join([sys.executable, "train.py", "hparams/train_ecapa_tdnn.yaml", "--data_folder", "data"])
    template += " " + " ".join(f"'{word}'" if " " in word else word for word in ECAPA_NETWORK)
    template += f" --out_n_neurons {len(source.speakers)}"
    command, _ = recipe_command("speechbrain", template, cwd=str(project))
    return Pair(
        workload="ecapa-tdnn",
        options={**workload.options, "augment_copies": 0},
        data_file=data_file,
        command=command,
    )


def _prepare_conformer(work: Path, args: argparse.Namespace) -> Pair:
    from autotune.data.asr import CharVocabulary
    from autotune.data.synth import generate_corpus

    if args.wenet_root is None:
        raise SystemExit("--system conformer needs --wenet-root, a WeNet checkout (WeNet is not on PyPI)")
    wenet_root = args.wenet_root.resolve()
    corpus = generate_corpus(work / "corpus", **CONFORMER_CORPUS)  # type: ignore[arg-type]
    project = work / "recipe"
    (project / "conf").mkdir(parents=True)
    (project / "conf" / "train_conformer.yaml").write_text((wenet_root / AISHELL_CONFIG).read_text())
    (project / "wenet").symlink_to(wenet_root / "wenet")
    (project / "exp" / "conformer").mkdir(parents=True)
    subprocess.run([sys.executable, str(WENET_PREPARE), str(corpus), str(project / "data")], check=True)
    workload = workloads.get("conformer")
    source = workload.load_data(str(project / "data" / "train" / "data.list"))
    notes = [f"corpus: {len(source.utterances)} training utterances of {_durations(source)}"]
    vocabulary = CharVocabulary.from_texts(u.text or "" for u in source.utterances)
    table = project / "data" / "dict" / "lang_char.txt"
    if len(table.read_text(encoding="utf-8").splitlines()) != len(vocabulary):
        table.write_text("".join(f"{s} {i}\n" for i, s in enumerate(vocabulary.symbols)), encoding="utf-8")
        notes.append("WeNet's char table rewritten from the training text, as the built-in builds its vocabulary")
    notes.append(f"vocabulary: {len(vocabulary)} tokens on both sides")
    options = {**workload.options, "speed_perturb": False}
    if workload.prepare_data is not None:
        workload.prepare_data(source, options)  # the global CMVN, cached before the trials as a run does
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(wenet_root), os.environ.get("PYTHONPATH")]))
    template = f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc_per_node=1 {WENET_ARGS}"
    command, _ = recipe_command("wenet", template, cwd=str(project))
    commit = _commit(wenet_root)
    notes.append(
        f"WeNet checkout {wenet_root} at {commit}; its {AISHELL_CONFIG} unchanged, on the command: {WENET_ARGS}"
    )
    data_file = yamlio.write_json(work / "data.json", source.to_dict())
    return Pair(workload="conformer", options=options, data_file=data_file, command=command, notes=notes)


def _prepare_campplus(work: Path, args: argparse.Namespace) -> Pair:
    from autotune.data.corruption import AUGMENTATION_LISTS, read_augmentation_files
    from autotune.data.synth_noise import ensure_noise_set

    project = work / "recipe"
    (project / "conf").mkdir(parents=True)
    shutil.copy(CAMPPLUS_CONFIG, project / "conf" / "cam++.yaml")
    (project / "cpu" / "speakerlab" / "bin").mkdir(parents=True)
    shutil.copy(SPEAKERLAB_CPU, project / "cpu" / "speakerlab" / "bin" / "train.py")
    source = data_module.default_source()
    rows = [f"{u.utt_id},{u.duration_s},{u.path},0,{u.duration_s},{u.speaker}" for u in source.utterances]
    (project / "data").mkdir()
    (project / "data" / "train.csv").write_text("\n".join(["ID,dur,path,start,stop,spk", *rows]) + "\n")
    lists = {}
    for kind, folder in (("noise", "musan"), ("reverb", "rirs")):  # absolute paths: speakerlab reads them as given
        files = read_augmentation_files(ensure_noise_set() / AUGMENTATION_LISTS[kind], kind)
        lists[kind] = project / "data" / folder / "wav.scp"
        lists[kind].parent.mkdir()
        lists[kind].write_text("".join(f"{Path(path).stem} {path}\n" for path in files))
    workload = workloads.get("cam++")
    read = workload.load_data(str(project / "data" / "train.csv"))
    options = {**workload.options, "speed_perturb": False, **{kind: str(path) for kind, path in lists.items()}}
    template = (
        f"{shlex.quote(sys.executable)} -m torch.distributed.run --standalone --nproc_per_node=1 {SPEAKERLAB_ARGS}"
    )
    sox_effects, _ = recipe_input.audio_stack()
    real_stack = recipe_input.audio_stack
    # The port decodes with soundfile (see the docstring): the recipe's torchaudio.load never runs. This command only.
    recipe_input.audio_stack = lambda: (sox_effects, None)
    try:
        command, _ = recipe_command("3d-speaker", template, cwd=str(project))
    finally:
        recipe_input.audio_stack = real_stack
    recorded = re.search(r"3D-Speaker ([0-9a-f]{40})", CAMPPLUS_CONFIG.read_text())
    notes = [
        f"corpus: the embedded one, {len(read.utterances)} files of {_durations(read)}, {len(read.speakers)} speakers, "
        "as one train.csv both sides read (a row a whole file); augmentation aug_prob 0.2 on both from "
        f"{sum(1 for _ in lists['noise'].open())} synthetic noise clips and "
        f"{sum(1 for _ in lists['reverb'].open())} room responses",
        f"speakerlab {_version('speakerlab')}, torch {_version('torch')}, torchaudio {_version('torchaudio')}; "
        f"conf/cam++.yaml as recorded from 3D-Speaker {recorded.group(1) if recorded else '?'}, unchanged; the "
        f"command: {SPEAKERLAB_ARGS}",
        _parameters(project, len(read.speakers), workload),
    ]
    data_file = yamlio.write_json(work / "data.json", read.to_dict())
    return Pair(workload="cam++", options=options, data_file=data_file, command=command, notes=notes)


def _parameters(project: Path, speakers: int, workload: workloads.Workload) -> str:
    """The networks' sizes on both sides: speakerlab's built from conf/cam++.yaml as train.py builds them."""
    from speakerlab.utils.builder import build
    from speakerlab.utils.config import build_config

    from autotune.models.margin import CosineClassifier

    config = build_config(str(project / "conf" / "cam++.yaml"), ["--data", str(project / "data" / "train.csv")])
    config.num_classes = speakers  # train.py: len(label_encoder), without speed perturbation
    embedder, classifier = build("embedding_model", config), build("classifier", config)
    theirs = [sum(p.numel() for p in module.parameters()) for module in (embedder, classifier)]
    embedding_size = int(str(workload.options["embedding_size"]))
    assert workload.count_parameters is not None
    ours = [
        workload.count_parameters(),
        sum(p.numel() for p in CosineClassifier(embedding_size, speakers).parameters()),
    ]
    checkpointed = sorted({bool(m.memory_efficient) for m in embedder.modules() if hasattr(m, "memory_efficient")})
    return (
        f"parameters ({'the same' if ours == theirs else 'DIFFERENT'}): CAM++ {ours[0]:,} built-in, {theirs[0]:,} "
        f"speakerlab (its CAMPPlus from conf/cam++.yaml); classifier {ours[1]:,} / {theirs[1]:,}; memory_efficient "
        f"{workload.options['memory_efficient']} / {', '.join(map(str, checkpointed))}"
    )


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _durations(source: data_module.DataSource) -> str:
    seconds = [u.duration_s for u in source.utterances]
    return f"{min(seconds):.1f}-{max(seconds):.1f} s"


def _commit(checkout: Path) -> str:
    ran = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return ran.stdout.strip() if ran.returncode == 0 else "unknown (not a git checkout)"


SYSTEMS = {
    "ecapa": System(
        framework="SpeechBrain",
        title="Built-in ECAPA-TDNN beside SpeechBrain's own training",
        provenance="SpeechBrain from PyPI, the recipe in examples/speechbrain_recipe at the network of "
        "recipes/VoxCeleb/SpeakerRec/hparams/train_ecapa_tdnn.yaml",
        report_stem="recipe-side-by-side",
        configs={
            "bs16 w0 fp32": TrialConfig(per_device_batch_size=16, num_workers=0, precision="fp32-default"),
            "bs16 w1 bf16": TrialConfig(
                per_device_batch_size=16, num_workers=1, prefetch_factor=2, persistent_workers=True, precision="bf16"
            ),
        },
        prepare=_prepare_ecapa,
    ),
    # WeNet's loader always has persistent workers (and at least one): the built-in's configurations match it.
    "conformer": System(
        framework="WeNet",
        title="Built-in conformer beside WeNet's own training",
        provenance=f"WeNet's wenet/bin/train.py with its {AISHELL_CONFIG}, data by examples/wenet_recipe/prepare.py",
        report_stem="conformer-wenet-side-by-side",
        configs={
            "bs16 w1 fp32": TrialConfig(
                per_device_batch_size=16, num_workers=1, prefetch_factor=2, persistent_workers=True, precision="fp32"
            ),
            "bs8 w2 fp32": TrialConfig(
                per_device_batch_size=8, num_workers=2, prefetch_factor=2, persistent_workers=True, precision="fp32"
            ),
        },
        prepare=_prepare_conformer,
    ),
    # 3D-Speaker's loader knobs: batch_size (global: train.py divides it by the world size, here 1), num_workers and
    # the dataloader block's pin_memory, prefetch_factor, persistent_workers; no precision knob (no AMP).
    "cam++": System(
        framework="3D-Speaker",
        title="Built-in CAM++ beside 3D-Speaker's own training",
        provenance="speakerlab's speakerlab/bin/train.py through its CPU port, with 3D-Speaker's "
        "egs/voxceleb/sv-cam++/conf/cam++.yaml",
        report_stem="cam++-3d-speaker-side-by-side",
        configs={
            "bs16 w0 fp32": TrialConfig(per_device_batch_size=16, num_workers=0, precision="fp32"),
            "bs16 w1 fp32": TrialConfig(
                per_device_batch_size=16, num_workers=1, prefetch_factor=2, persistent_workers=True, precision="fp32"
            ),
        },
        prepare=_prepare_campplus,
    ),
}


def _spec(workload: str, options: dict[str, object], data_file: str, config: TrialConfig, timing: TimingSettings,
          folder: Path) -> TrialSpec:  # fmt: skip
    return TrialSpec(
        workload=workload,
        workload_options=options,
        data_file=data_file,
        config=config,
        timing=timing,
        device_type="cpu",
        result_path=str(folder / "result.json"),
    )


def _rate(result: TrialResult, who: str, batch: int) -> tuple[float, float]:
    """The window's own samples per second (what the probe measures for a framework's training, and the built-in's
    figure before its epoch-mix correction, trial/epoch_mix.py, which the probe does not make) and the batch over the
    median step time, which one step disturbed by another process on this machine moves little."""
    rate = result.window_samples_per_second or result.samples_per_second
    if result.status != "ok" or not rate:
        print(f"  {who} trial: {result.status}: {result.reason}", file=sys.stderr)
        return float("nan"), float("nan")
    batches_per_step = (result.observed or {}).get("grad_accum_steps")
    if batches_per_step is not None and batches_per_step > 1:  # every side steps once a batch here
        print(
            f"  {who} trial: {batches_per_step:.2f} batches a step: another loader's (a dev pass) counted", flush=True
        )
    median = result.step_time_median_s
    return float(rate), batch / median if median else float("nan")


def _trial(side: str, pair: Pair, config: TrialConfig, timing: TimingSettings, folder: Path) -> tuple[float, float]:
    batch = config.per_device_batch_size
    if side == "built-in":
        spec = _spec(pair.workload, pair.options, str(pair.data_file), config, timing, folder)
        return _rate(launch(spec, workdir=folder, timeout_s=900), side, batch)
    spec = _spec("command", {}, "", config, timing, folder)
    return _rate(CommandLauncher(command=pair.command)(spec, workdir=folder, timeout_s=900), side, batch)


def _report(system: System, pair: Pair, rates: dict[tuple[str, str], list[tuple[float, float]]],
            minutes: float, loads: list[float]) -> str:  # fmt: skip
    command = " ".join(sys.argv[1:])
    lines = [
        f"# {system.title} ({date.today()}, {platform.node()}, CPU)",
        "",
        f"`.venv/bin/python benchmarks/recipe_side_by_side.py {command}` ({minutes:.0f} min; {system.provenance})",
        "",
        *(f"- {note}" for note in pair.notes),
        f"- load average (1 min, the trial's own work included) at each trial's end, {os.cpu_count()} CPUs: "
        f"{min(loads):.1f}-{max(loads):.1f}",
        "",
        f"| configuration | built-in samples/s (rounds) | {system.framework} samples/s (rounds) | "
        f"built-in / {system.framework} (medians) | spread of a side's rounds (max/min) |",
        "|---|---|---|---|---|",
    ]
    for name in system.configs:
        for kind, index in (("window", 0), ("median step", 1)):
            ours = [rate[index] for rate in rates[(name, "built-in")]]
            theirs = [rate[index] for rate in rates[(name, system.framework)]]
            ratio = statistics.median(ours) / statistics.median(theirs)
            spread = " / ".join(f"{max(side) / min(side):.2f}" for side in (ours, theirs))
            lines.append(
                f"| {name}, {kind} | {' / '.join(f'{v:.2f}' for v in ours)} | "
                f"{' / '.join(f'{v:.2f}' for v in theirs)} | {ratio:.2f} | {spread} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=sorted(SYSTEMS), default="ecapa")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of steady steps per trial")
    parser.add_argument("--wenet-root", type=Path, default=None, help="a WeNet checkout (--system conformer)")
    parser.add_argument("--out", type=Path, default=None, help="the markdown report (default benchmarks/results/)")
    args = parser.parse_args()
    system = SYSTEMS[args.system]
    timing = TimingSettings(window_s=args.window, max_throughput_cv=None)
    rates: dict[tuple[str, str], list[tuple[float, float]]] = {}
    loads: list[float] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as temp:
        work = Path(temp)
        pair = system.prepare(work, args)
        for round_index in range(args.rounds):
            for name, config in system.configs.items():
                order = ["built-in", system.framework]
                for side in order if round_index % 2 == 0 else order[::-1]:
                    folder = work / f"r{round_index}-{name.replace(' ', '_')}-{side}"
                    window, step = _trial(side, pair, config, timing, folder)
                    rates.setdefault((name, side), []).append((window, step))
                    loads.append(os.getloadavg()[0])  # this machine is shared: how busy it was
                    print(
                        f"round {round_index + 1} {name} {side}: {window:.2f} samples/s (median step: {step:.2f}; "
                        f"load average {loads[-1]:.1f})",
                        flush=True,
                    )
    report = _report(system, pair, rates, (time.perf_counter() - started) / 60, loads)
    print(report)
    out = args.out or ROOT / "benchmarks" / "results" / f"{system.report_stem}-{date.today()}.md"
    out.write_text(report)


if __name__ == "__main__":
    main()
