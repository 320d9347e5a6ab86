"""Every number, name and path a run is given, checked once, in one place, before anything is created or measured.

`autotune.run.runner.prepare` calls `check_request` first and `check_workload_options` once the workload is known; the
CLI only turns text into values (`autotune.cli.parsing`). Each problem is one UserError line that names the option
as the user typed it and says what would be accepted: a NaN or an infinity is refused like any other bad number
(comparisons with NaN are all false, so `window <= 0` alone lets it through).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import UserError

if TYPE_CHECKING:
    from autotune.run.plan import RunRequest
    from autotune.workloads import Workload

__all__ = [
    "SAMPLERS",
    "DEVICES",
    "MAX_SEED",
    "MIN_BUDGET_S",
    "check_request",
    "check_workload_options",
    "check_path_text",
]

SAMPLERS = ("tpe", "random", "grid")
DEVICES = ("auto", "cuda", "cpu")
# The shortest --budget taken: below it not even the baseline's trial fits (docs/how-it-measures.md#options), and the
# run would end "no stable configuration" for a reason that is not the configurations'.
MIN_BUDGET_S = 60.0
MAX_SEED = 2**32 - 1  # NumPy's and so Optuna's samplers take seeds in [0, 2**32 - 1]
# The ranges that can produce a measurement. A trial starts a process (seconds: the Python and torch imports), warms up
# and times a window: under ten seconds none can, and a window must leave its trial room to start and warm up.
MIN_TRIAL_TIMEOUT_S = 10.0
MAX_TRIAL_TIMEOUT_S = 24 * 3600.0
MAX_WINDOW_S = 3600.0
MAX_TRIALS = 100_000
MAX_CONFIRM = 1000
MAX_DEVICES = 2**16  # as the world_size knob (knobs/declarations.py)
MAX_GLOBAL_BATCH = 2**24  # samples per optimizer step
MAX_EPOCH_SAMPLES = 10**12
MAX_EPOCH_HOURS = 10**6
# An audio crop per sample: a tenth of a second holds ten fbank frames; ten minutes is past any recipe's crop.
CROP_RANGE_S = (0.1, 600.0)
# Workload options that must be positive, with the command-line option that also sets them.
_POSITIVE_OPTIONS = {"crop_s": "--crop-seconds"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def check_request(request: RunRequest) -> None:
    """Every setting of a run that needs no hardware, workload or data to judge.

    Raises:
        UserError: one line for the first problem found.
    """
    settings, timing = request.settings, request.settings.timing
    _require(settings.sampler in SAMPLERS, f"unknown sampler {settings.sampler!r}; use {', '.join(SAMPLERS)}")
    _require(request.device in DEVICES, f"unknown device {request.device!r}; use {', '.join(DEVICES)}")
    _require(
        isinstance(settings.trials, int) and settings.trials >= 1, f"--trials must be at least 1, got {settings.trials}"
    )
    _require(settings.trials <= MAX_TRIALS, f"--trials must be at most {MAX_TRIALS:,}, got {settings.trials}")
    _require(
        settings.budget_s is None or (_finite(settings.budget_s) and settings.budget_s > 0),
        "--budget must be positive, e.g. 15m or 1h (or none for no budget)",
    )
    _require(
        settings.budget_s is None or settings.budget_s >= MIN_BUDGET_S,
        f"a --budget of {settings.budget_s or 0:g} s is too short to measure anything: one trial alone takes most of a "
        "minute to start, warm up and time its window; give at least 1m (5m or more on a CPU; the default is 15m), "
        "or none",
    )
    _require(
        _finite(settings.trial_timeout_s) and settings.trial_timeout_s > 0,
        f"--trial-timeout must be a positive duration, e.g. 90s or 5m, got {settings.trial_timeout_s:g} s",
    )
    _require(
        MIN_TRIAL_TIMEOUT_S <= settings.trial_timeout_s <= MAX_TRIAL_TIMEOUT_S,
        f"--trial-timeout {settings.trial_timeout_s:g} s cannot hold a trial: it starts a process, warms up and times "
        f"a window; give between {MIN_TRIAL_TIMEOUT_S:g} s and {MAX_TRIAL_TIMEOUT_S / 3600:g} h (the default is 5m)",
    )
    _require(
        isinstance(settings.seed, int) and 0 <= settings.seed <= MAX_SEED,
        f"--seed must be between 0 and {MAX_SEED} (2**32 - 1), got {settings.seed}",
    )
    _require(
        0 <= settings.confirm_top_k <= MAX_CONFIRM,
        f"--confirm must be between 0 and {MAX_CONFIRM}, got {settings.confirm_top_k}",
    )
    _require(settings.parallel >= 1, f"--parallel must be at least 1 (trials in flight), got {settings.parallel}")
    _require(
        settings.parallel == 1 or request.slurm is not None,
        f"--parallel {settings.parallel} needs --executor slurm: each trial in flight takes a node of its own "
        "(trials side by side on this machine would measure each other)",
    )
    _require(
        _finite(timing.window_s) and timing.window_s > 0,
        f"--window must be a positive number of seconds, got {timing.window_s}",
    )
    _require(
        timing.window_s <= min(MAX_WINDOW_S, settings.trial_timeout_s / 2),
        f"--window {timing.window_s:g} s leaves its trial no room to start and warm up within --trial-timeout "
        f"{settings.trial_timeout_s:g} s; give at most half the trial timeout (and at most {MAX_WINDOW_S:g} s)",
    )
    _require(
        1 <= timing.warmup_steps <= timing.max_warmup_steps,
        f"--warmup-steps must be between 1 and {timing.max_warmup_steps} (warm-up ends there whatever it is), "
        f"got {timing.warmup_steps}",
    )
    _require(
        _finite(timing.memory_headroom_fraction) and 0 <= timing.memory_headroom_fraction < 1,
        f"--headroom must be a fraction in [0, 1), e.g. 0.1, got {timing.memory_headroom_fraction}",
    )
    cv = timing.max_throughput_cv
    _require(
        cv is None or (_finite(cv) and cv > 0),
        f"--max-throughput-cv must be 0 (off) or positive, e.g. 0.3, got {cv}",
    )
    _check_epoch(request)
    _require(
        _finite(request.warm_fraction) and 0 < request.warm_fraction <= 1,
        f"--warm-fraction must be in (0, 1], e.g. 0.5, got {request.warm_fraction}",
    )
    _require(
        _finite(request.drift_threshold) and 0 < request.drift_threshold < 1,
        f"--drift-threshold must be in (0, 1), e.g. 0.10, got {request.drift_threshold}",
    )
    _require(request.devices is None or request.devices >= 1, f"--devices must be at least 1, got {request.devices}")
    _require(
        request.devices is None or request.devices <= MAX_DEVICES,
        f"--devices must be at most {MAX_DEVICES:,}, got {request.devices}",
    )
    _require(
        request.global_batch is None or request.global_batch >= 1,
        f"--global-batch must be at least 1, got {request.global_batch}",
    )
    _require(
        request.global_batch is None or request.global_batch <= MAX_GLOBAL_BATCH,
        f"--global-batch {request.global_batch} is past any recipe's batch; give at most {MAX_GLOBAL_BATCH:,} "
        "samples per optimizer step",
    )
    check_path_text(request.results_dir, "--results-dir")
    for value, option in ((request.results_dir, "--results-dir"), (request.out, "--out")):
        try:
            Path(value).resolve() if value is not None else None
        except (RuntimeError, OSError) as error:  # a symlink loop (RuntimeError before Python 3.13)
            raise UserError(
                f"{option} {value} cannot be followed ({error}); fix the link or choose another path"
            ) from None
    if request.out is not None:
        check_path_text(request.out, "--out")
        out = Path(request.out)
        _require(not _is_dir(out), f"--out {out} is a folder; give a file path, e.g. {out / 'result.yaml'}")
        _require(out.name not in ("", ".", ".."), f"--out {request.out!r} names no file; give a file path")
    for value, option in ((request.data, "--data"), (request.space, "--space"), (request.storage, "--storage")):
        _require(
            value is None or bool(value.strip()),
            f"{option} is empty; give a value, or leave the option out for its default",
        )
        if value is not None:  # each is recorded in the result: text that cannot be written must not get that far
            check_path_text(value, option)
    storage = (request.storage or "").strip().lower()
    _require(
        storage not in ("sqlite://", "sqlite:///:memory:") and not storage.startswith("sqlite:///:memory:?"),
        f"--storage {request.storage} is an in-memory database, which ends with the run (and the study with it); "
        "give a file, e.g. sqlite:///results/studies.db, or leave the option out",
    )


def _is_dir(path: Path) -> bool:
    """Whether path is a folder; a name the file system refuses (too long) is not one (run/output.py says why)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _check_epoch(request: RunRequest) -> None:
    samples, hours = request.epoch_samples, request.epoch_hours
    _require(samples is None or samples >= 1, f"--epoch-samples must be at least 1, got {samples}")
    _require(
        samples is None or samples <= MAX_EPOCH_SAMPLES,
        f"--epoch-samples must be at most {MAX_EPOCH_SAMPLES:,}, got {samples}",
    )
    _require(
        hours is None or (_finite(hours) and 0 < hours <= MAX_EPOCH_HOURS),
        f"--epoch-hours must be positive (hours of audio per epoch, at most {MAX_EPOCH_HOURS:,}), got {hours}",
    )
    _require(samples is None or hours is None, "--epoch-hours cannot be combined with --epoch-samples; give one")


def check_path_text(path: str, option: str) -> None:
    """A path must be text that files and logs can hold: a name that is not valid UTF-8 (it reaches Python as lone
    surrogates) cannot be written into the result, the history or a SQLite URL, and a control character (a newline)
    would break the line it is written on."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # the bytes as `ls -b` shows them
        raise UserError(f"{option} {shown} is not a valid UTF-8 name; rename it or choose another path") from None
    if any(ord(char) < 32 or ord(char) == 127 for char in str(path)):  # a newline would end a line of the result
        raise UserError(f"{option} {str(path)!r} holds a control character (a newline?); choose a plain path")


def check_workload_options(workload: Workload, options: dict[str, Any]) -> None:
    """`--option` values (and --crop-seconds) against the workload's declared options and their defaults' types.

    A number must be finite and of the default's kind (an integer where the default is one), a flag a flag, text
    text; `crop_s` must be positive. A default of None takes anything (a plugin's free-form option).

    Raises:
        UserError: an unknown key (with the valid ones) or a value of the wrong kind.
    """
    unknown = set(options) - set(workload.options)
    if unknown:
        raise UserError(
            f"unknown option {sorted(unknown)[0]!r} for {workload.name}; it takes {sorted(workload.options)}"
        )
    for key, value in options.items():
        for text in _texts(value):
            check_path_text(text, f"--option {key}")
        default = workload.options[key]
        problem = _option_problem(default, value)
        flag = f"--option {key}"
        if key in _POSITIVE_OPTIONS:
            flag = f"{_POSITIVE_OPTIONS[key]} (--option {key})"
            if problem is None and _finite(value) and not value > 0:
                raise UserError(f"{_POSITIVE_OPTIONS[key]} must be positive (--option {key} too), got {value!r}")
            low, high = CROP_RANGE_S
            if problem is None and _finite(value) and not low <= value <= high:
                raise UserError(
                    f"{_POSITIVE_OPTIONS[key]} {value!r} s cannot be cropped and trained (--option {key} too): give "
                    f"between {low:g} and {high:g} s (the recipe's crop is {default!r} s)"
                )
        if problem is not None:
            raise UserError(f"{flag} must be {problem} for {workload.name} (default {default!r}), got {value!r}")


def _texts(value: Any) -> list[str]:
    """Every string in an option's value (a JSON value: nested lists and mappings)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (*_texts(key), *_texts(item))]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return []


def _option_problem(default: Any, value: Any) -> str | None:
    """What kind of value the option needs, when `value` is not one (None when it fits)."""
    if default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if isinstance(default, float):
        return None if _finite(value) else "a finite number"
    for kind, name in ((str, "text"), (dict, "a mapping (JSON object)"), (list, "a list (JSON array)")):
        if isinstance(default, kind):
            return None if isinstance(value, kind) else name
    return None
