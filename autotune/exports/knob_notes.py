"""The notes an export adds for a knob its target carries partly or not at all, shared by the targets: where the
framework computes or builds what the knob changed, and what to edit to train as measured."""

from __future__ import annotations

from autotune.exports.base import ExportContext, KnobNotes, takes

__all__ = [
    "THREADS",
    "checkpointing_note",
    "compile_note",
    "cudnn_benchmark_note",
    "feature_note",
    "optimizer_note",
    "preload_note",
    "unordered_note",
]


def _threads_note(context: ExportContext) -> list[str]:
    threads = context.config.intra_op_threads
    if threads is None:
        return []
    return [
        f"intra_op_threads={threads} was tuned: set OMP_NUM_THREADS={threads} for every training process (torchrun "
        "sets 1 when it starts several processes and OMP_NUM_THREADS is unset)"
    ]


# Every command-line target carries the thread count in the command's environment (ExportContext.env_prefix).
THREADS = takes("OMP_NUM_THREADS in the command's environment", notes=_threads_note)


def cudnn_benchmark_note(lacks: str, fix: str) -> KnobNotes:
    """The note for a target that has no cudnn.benchmark option, for a winner measured with it on (on CUDA).

    Args:
        lacks: what has no option for it, e.g. "wenet/bin/train.py has no flag for it".
        fix: the edit that matches the measurement, e.g. "add torch.backends.cudnn.benchmark = True".
    """

    def note(context: ExportContext) -> list[str]:
        if not (context.config.cudnn_benchmark and context.on_cuda):
            return []
        return [f"The tuned run used cudnn.benchmark=True; {lacks}: {fix} to match"]

    return note


def preload_note(framework: str) -> KnobNotes:
    """The note for a preloaded winner: no framework decodes the corpus into RAM before training as autotune did."""

    def note(context: ExportContext) -> list[str]:
        if not context.config.preload_audio:
            return []
        return [
            "The tuned run decoded every utterance into RAM once before training (preload_audio, the result's audio "
            f"section); {framework} reads the audio as it trains, so without that change to its dataset it waits for "
            "data as the configurations without preloading did, not as measured"
        ]

    return note


def optimizer_note(how: str) -> KnobNotes:
    """The note for a tuned optimizer implementation: what carries it in this target, and that the maths is the same.

    Args:
        how: where the target's optimizer takes the flag, e.g. "the optimizer block's args (train.py builds it)".
    """

    def note(context: ExportContext) -> list[str]:
        flag = context.optimizer_flag()
        if not flag:
            return []
        (key,) = flag
        return [
            f"optimizer_impl {key}: {key}=True reaches torch.optim through {how}; it computes the same update as the "
            "recipe's optimizer (up to rounding) with fewer kernel launches. It needs a torch that has it for your "
            "device (fused on a CPU: torch 2.4+)"
        ]

    return note


def unordered_note(framework: str, carried: bool) -> KnobNotes:
    """The note for a winner measured with in_order=False: what it changes for reproducibility where the target
    carries it, or that the target runs its batches in order where it cannot (its DataLoader call has no in_order).

    Args:
        framework: the target's name and, where it cannot carry it, where it builds its DataLoader.
        carried: whether the export passes in_order=False to the target's DataLoader.
    """

    def note(context: ExportContext) -> list[str]:
        if context.config.in_order or context.config.num_workers == 0:
            return []
        if carried:
            return [
                "in_order=False: the DataLoader hands over each batch as soon as a worker has it, so a slow item does "
                "not stall the batches behind it; every batch still comes once per epoch, but their order follows the "
                "workers' timing, so two runs with the same seed do not see the batches in the same order. Set "
                "in_order=True to reproduce a run batch for batch (torch 2.6+ has the argument)"
            ]
        return [
            f"The tuned run used DataLoader(in_order=False); {framework} builds its DataLoader without in_order, so it "
            "hands over batches in sampler order and a slow item stalls those behind it, as the in-order "
            "configurations did"
        ]

    return note


def checkpointing_note(framework: str, change: str) -> KnobNotes:
    """The note for a result tuned with activation checkpointing set where the target has no switch carrying it.

    Args:
        framework: the target's name (and where its model is built).
        change: what the user would change in its model code to run what was measured.
    """

    def note(context: ExportContext) -> list[str]:
        value = context.config.activation_checkpointing
        if value is None:  # the recipe's own: nothing was changed
            return []
        state = "on" if value else "off"
        return [
            f"activation_checkpointing was tuned {state} for {context.model_name}; {framework} has no switch for it: "
            f"{change}. Without that change the memory per sample differs from what was measured, and the tuned "
            "batch may not fit or may leave memory unused"
        ]

    return note


def compile_note(framework: str, where: str) -> KnobNotes:
    """The note for a compiled winner in a target that has no compile option: where to add the call to match.

    Args:
        where: the framework's file and place where the network is built, e.g. "speakerlab/bin/train.py, after
            build('embedding_model', ...)".
    """

    def note(context: ExportContext) -> list[str]:
        if context.compile_kwargs() is None:
            return []
        metrics = context.tuned.metrics.get("winner") or {}
        cost = metrics.get("compile_s")
        paid = f" (compiling cost {cost:.0f} s here, charged over the run length)" if cost is not None else ""
        return [
            f"compile {context.config.compile} was measured{paid}; {framework} has no option for torch.compile: "
            f"call {context.compile_call()} on each network module in {where} (in place: parameters and optimizer "
            "unchanged) to train as measured; without it training runs eager, at the eager configurations' speed"
        ]

    return note


def feature_note(framework: str, runs: str, where: str, change: str) -> KnobNotes:
    """The note for a tuned feature placement (feature_device) the framework does not run.

    Args:
        framework: the target's name in the note.
        runs: where it computes the features: "workers" or "device" (autotune/knobs/feature_device.py).
        where: where that is in its code, naming the file.
        change: what to change to train as measured.
    """

    def note(context: ExportContext) -> list[str]:
        tuned = context.config.feature_device
        if tuned is None or tuned == runs:
            return []
        measured = "batch-wise in the training step on the device" if tuned == "device" else "in the DataLoader workers"
        return [
            f"The tuned run computed the fbank {measured} (feature_device {tuned}, the result's features section); "
            f"{framework} computes it {where}: {change}"
        ]

    return note
