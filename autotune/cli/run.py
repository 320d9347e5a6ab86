"""`autotune run`: its options, parsed into a RunRequest, handed to the runner; the plan, progress and summary
printed; how the run ended said by its exit code (cli/exit.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.app import app, setup_logging
from autotune.cli.exit import (
    EXIT_INTERRUPTED,
    EXIT_NO_STABLE_CONFIG,
    finish,
    machine_failure_line,
    machine_failures,
    sigterm_interrupts,
)
from autotune.cli.output import fail, stderr_console, stdout_console
from autotune.cli.run_args import run_request
from autotune.errors import MACHINE_FAILURE_EXIT_CODE, UserError
from autotune.trial.spec import ERRATIC_THROUGHPUT_CV

__all__ = ["RUN_HELP", "run"]

RUN_HELP = """Tune the training throughput of a model on this machine and write the fastest stable configuration.

Runs the recipe's own configuration first as the baseline, then an Optuna search of short timed training \
trials (each in a fresh process, real model, real data pipeline), re-measures the leaders, and writes the \
winner as YAML.

[bold]Examples[/bold]

  autotune run --model cam++                          [dim]# embedded synthetic corpus[/dim]

  autotune run --model cam++ --data data/train.csv --budget 30m

  autotune run --model cam++ --data /data/vox/wav.scp_dir --trials 40 --out cam++.yaml

  autotune run --model cam++ --data data/train.csv --devices 4 --global-batch 256   [dim]# DDP, recipe batch[/dim]

  autotune run --model cam++ --storage journal:///shared/cam.log   [dim]# several processes on one host[/dim]

  autotune run --command 'python train.py --config {config} --num-workers {num_workers}' \\
      --config-file conf/train.yaml --set train.batch_size={per_device_batch_size}   [dim]# your own training[/dim]

  autotune run --lightning mypkg.train:make --trainer devices=2   [dim]# your LightningModule, Lightning's Trainer[/dim]

  autotune run --recipe speechbrain --command 'python train.py hparams/train.yaml --data_folder data'

A rerun on the same data and hardware continues the study: it re-measures the previous winner and its best \
neighbours first, searches with --warm-fraction of the trials and budget, and compares: a previous winner slower \
than its recorded throughput by more than --drift-threshold is a regression (with what changed: torch, CUDA, \
driver, GPU, autotune); the YAML is rewritten only when a new configuration is faster by more than the threshold.

[bold]Exit codes[/bold]: 0 done (result written, or kept unchanged); 1 no stable configuration; 2 bad input; \
3 regression: the previous winner got slower (the history is still recorded); 4 the machine failed the run \
(a full disk, a storage that stopped answering: the best so far written where it could be, completed trials stay \
in the study); 130 interrupted (Ctrl-C or SIGTERM: the current trial is stopped, the best so far written, \
completed trials stay in the study).
"""


@app.command(help=RUN_HELP)
def run(
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="Workload name (see 'autotune models') or package.module:factory; with --command, the name of the "
            "result (default: the training script's).",
        ),
    ] = None,
    command: Annotated[
        Optional[str],
        typer.Option(
            help="Your own training command, with {knob} placeholders for the values to tune (result YAML names: "
            "{per_device_batch_size}, {num_workers}, ...; {config}: the tuned copy of --config-file), e.g. "
            "'python train.py --config {config} --num-workers {num_workers}' (docs/own-training.md).",
        ),
    ] = None,
    recipe: Annotated[
        Optional[str],
        typer.Option(
            help="--command runs this framework's recipe (speechbrain, espnet, 3d-speaker, wenet): the tuned values go "
            "in as the framework's own overrides, as `autotune export --to` writes them; your values today are read "
            "from the recipe's files and command.",
        ),
    ] = None,
    lightning: Annotated[
        Optional[str],
        typer.Option(
            help="Your Lightning training: package.module:factory (or file.py:factory), a callable returning your "
            "LightningModule and its LightningDataModule or train DataLoader, taking the DataLoader knobs it builds "
            "with as keyword arguments (per_device_batch_size, num_workers, ...); fitted by Lightning's Trainer with "
            "the precision autotune searches (docs/own-training.md).",
        ),
    ] = None,
    trainer: Annotated[
        Optional[list[str]],
        typer.Option(
            help="--lightning: KEY=VALUE given to Lightning's Trainer as is (devices=2, accumulate_grad_batches=4, "
            "use_distributed_sampler=false, ...); repeatable.",
        ),
    ] = None,
    config_file: Annotated[
        Optional[Path],
        typer.Option(help="--command: your training's config file (YAML or JSON); trials read a tuned copy of it."),
    ] = None,
    set_key: Annotated[
        Optional[list[str]],
        typer.Option(
            "--set",
            help="--command: KEY=VALUE in the copy of --config-file, dotted, e.g. "
            "train.batch_size={per_device_batch_size}; repeatable. The key must be in the file.",
        ),
    ] = None,
    apply: Annotated[
        Optional[list[str]],
        typer.Option(
            help="--command: a DataLoader knob autotune sets inside your training (num_workers, pin_memory, "
            "prefetch_factor, persistent_workers); repeatable."
        ),
    ] = None,
    baseline: Annotated[
        Optional[list[str]],
        typer.Option(
            help="--command: KNOB=VALUE, your training's value today (per_device_batch_size=32); repeatable. "
            "Default: the --set keys' values in the file, else torch's defaults."
        ),
    ] = None,
    data: Annotated[
        Optional[str],
        typer.Option(
            help="3D-Speaker train.csv, WeNet data.list, a Kaldi folder (wav.scp + utt2spk; text for ASR) "
            "or a folder of audio files. "
            "Default: the embedded synthetic corpus."
        ),
    ] = None,
    trials: Annotated[int, typer.Option(help="Trials to run, the baseline included (confirmations come on top).")] = 24,
    budget: Annotated[
        Optional[str],
        typer.Option(
            help="Wall-clock budget for the whole run, e.g. 15m or 1h, at least 1m: a ceiling (no trial starts that "
            "would end past it); none: only --trials limits the run."
        ),
    ] = "15m",
    storage: Annotated[
        Optional[str],
        typer.Option(
            help="Where the study lives: sqlite:///FILE.db, postgresql://USER@HOST/DB (several machines; keep the "
            "password in ~/.pgpass or PGPASSWORD) or journal:///FILE.log (several processes on one host). "
            "Default: sqlite under --results-dir; a rerun continues the same study."
        ),
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option(help="Result YAML. Default: RESULTS_DIR/MODEL/HARDWARE_FINGERPRINT.yaml.")
    ] = None,
    results_dir: Annotated[Path, typer.Option(help="Folder for results, studies and logs of failed trials.")] = Path(
        "results"
    ),
    space: Annotated[
        Optional[Path], typer.Option(help="Search-space YAML. Default: the built-in one of the model.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    devices: Annotated[
        Optional[int],
        typer.Option(
            help="Devices per trial (per node with --nodes): every trial trains data-parallel on N GPUs (NCCL), or as "
            "N processes on a CPU (gloo). Default: every visible GPU; 1 on a CPU."
        ),
    ] = None,
    global_batch: Annotated[
        Optional[int],
        typer.Option(
            help="Hold the global batch fixed (the recipe's optimisation) and search the per-device micro-batch "
            "with gradient accumulation making up the rest. Default: the per-device batch is free."
        ),
    ] = None,
    sampler: Annotated[str, typer.Option(help="tpe (default), random or grid.")] = "tpe",
    window: Annotated[
        float,
        typer.Option(
            help="Seconds of each timed window, at least: longer where a trial's start-up and warm-up ask for it "
            "(four fifths of every trial is measured), and twice as long on a busy machine."
        ),
    ] = 10.0,
    warmup_steps: Annotated[
        int,
        typer.Option(
            help="Training steps before the timed window, at least (and a tenth of --window); a start-up transient "
            "found in the window afterwards is moved to warm-up."
        ),
    ] = 1,
    trial_timeout: Annotated[
        str, typer.Option(help="Hard limit per trial; a trial past it is killed as a hang.")
    ] = "5m",
    confirm: Annotated[
        int,
        typer.Option(
            help="How many leading configurations to re-measure before choosing (at least 8, by sequential "
            "halving, on a run whose --trials and --budget hold 40 search trials)."
        ),
    ] = 3,
    headroom: Annotated[float, typer.Option(help="Fraction of device memory a winner must leave free.")] = 0.10,
    max_throughput_cv: Annotated[
        float,
        typer.Option(
            help="Reject configurations whose throughput varies more than this across the window's quarters "
            "(std/mean), in two windows; 0 switches the gate off."
        ),
    ] = ERRATIC_THROUGHPUT_CV,
    crop_seconds: Annotated[
        Optional[float], typer.Option(help="Audio crop per training sample (the recipe's 3.0 s by default).")
    ] = None,
    option: Annotated[
        Optional[list[str]],
        typer.Option(
            "--option",
            help="Workload option KEY=VALUE, repeatable; e.g. noise=musan/wav.scp and reverb=rirs/wav.scp for cam++ "
            "(3D-Speaker's augmentation lists; default: autotune's synthetic ones). An unknown key is refused with "
            "the valid ones.",
        ),
    ] = None,
    epoch_samples: Annotated[
        Optional[int],
        typer.Option(
            help="Samples per epoch of your training (default: the data list's size): the epoch-time prediction, and "
            "the epoch each new epoch's start is charged over (on the embedded corpus, none is charged without it)."
        ),
    ] = None,
    epoch_hours: Annotated[
        Optional[float],
        typer.Option(help="Hours of audio per epoch of your training, instead of --epoch-samples."),
    ] = None,
    run_length: Annotated[
        str,
        typer.Option(
            help="How long you will train with the result: epochs of the data (3ep) or a time (12h, 90m). One-off "
            "costs (torch.compile's compile time) are charged over it: a compile the run does not repay never wins."
        ),
    ] = "1ep",
    prune: Annotated[bool, typer.Option(help="Stop search trials early that run far below the best so far.")] = True,
    amp_check: Annotated[
        bool,
        typer.Option(
            help="Before the search, check that bf16/fp16 train like fp32 (loss curves from the same weights on the "
            "same batches); a precision that does not is never tried."
        ),
    ] = True,
    ceiling: Annotated[
        bool,
        typer.Option(
            help="After confirmation, measure the winner once more on batches already in memory (the compute-only "
            "ceiling: pipeline efficiency, FLOPs per sample)."
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed for the sampler and the trials.")] = 0,
    warm_start: Annotated[
        bool, typer.Option(help="On a rerun, re-measure the previous winner and its best neighbours first.")
    ] = True,
    warm_fraction: Annotated[
        float,
        typer.Option(
            help="Share of --trials and --budget a warm-started rerun spends on its search (never less budget than "
            "its re-measurements, a search trial and a confirmation need)."
        ),
    ] = 0.5,
    drift_threshold: Annotated[
        float,
        typer.Option(help="Relative change that counts: a slower previous winner (exit 3) or a faster new one."),
    ] = 0.10,
    executor: Annotated[
        str,
        typer.Option(
            help="Where trials run: local (subprocesses on this machine) or slurm (each trial a SLURM job through "
            "submitit, its files on the shared file system: docs/cluster.md)."
        ),
    ] = "local",
    slurm_partition: Annotated[
        Optional[str], typer.Option(help="--executor slurm: the partition trials are submitted to.")
    ] = None,
    slurm_option: Annotated[
        Optional[list[str]],
        typer.Option(
            "--slurm-option",
            help="--executor slurm: a job parameter KEY=VALUE as submitit names it (mem=64G, account=speech, "
            "exclusive=false, time=30), repeatable; overrides what autotune asks for each trial.",
        ),
    ] = None,
    slurm_pin_wait: Annotated[
        Optional[str],
        typer.Option(
            help="--executor slurm: how long a confirmation waits in the queue for its leader's node before it runs "
            "on another (e.g. 3m; default 3% of --budget, 1-10 min: docs/cluster.md)."
        ),
    ] = None,
    parallel: Annotated[
        int,
        typer.Option(
            help="--executor slurm: search trials in flight at once, each a job on a node of its own (at most the "
            "partition's nodes); the baseline and the confirmations run one at a time."
        ),
    ] = 1,
    nodes: Annotated[
        int,
        typer.Option(
            help="--executor slurm: nodes per trial, --devices ranks on each, started by torchrun on every node "
            "(one job of that many nodes per trial: docs/cluster.md)."
        ),
    ] = 1,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Let the result replace a file at --out that autotune did not write (refused without it, before any "
            "trial).",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens in detail.")] = False,
) -> None:
    params = {name: value for name, value in locals().items() if name != "verbose"}  # run_request's keywords
    setup_logging(verbose)
    from autotune.cli.display import RichReporter, print_plan, print_summary
    from autotune.run import runner

    try:
        request = run_request(**params)
        stderr_console.print("[dim]checking inputs and preparing data...[/dim]")
        if command is not None or lightning is not None:
            stderr_console.print("[dim]running your training once to see which values reach it...[/dim]")
        if data is None and command is None and lightning is None:
            stderr_console.print(
                "[dim]no --data: using the embedded synthetic corpus "
                "(generated once into the cache, about 300 MB)[/dim]"
            )
        with sigterm_interrupts():
            plan = runner.prepare(request)
            print_plan(stderr_console, plan)
            reporter = RichReporter(stderr_console, plan.request.settings)  # as prepared
            with reporter:
                report = runner.execute(plan, reporter)
    except UserError as error:
        raise fail(str(error), error.exit_code) from None
    except runner.TuningFailed as error:
        raise fail(str(error), EXIT_NO_STABLE_CONFIG) from None
    except KeyboardInterrupt:
        raise fail("interrupted; completed trials are kept in the study, rerun to continue", EXIT_INTERRUPTED) from None
    except machine_failures() as error:  # a disk that filled, a database that went away: one line, not a traceback
        raise fail(machine_failure_line(error), MACHINE_FAILURE_EXIT_CODE) from None
    print_summary(stdout_console, report)
    finish(report)
