"""Shared helpers of the export tests: tuned results built directly, and printed commands read back through bash."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from autotune.exports import Export
from autotune.knobs.config import TrialConfig
from autotune.result.tuned_config import TunedConfig

RECIPES = Path(__file__).parent / "recipes"
NAMES = ("3d-speaker", "wenet", "speechbrain", "espnet", "lightning", "amphion", "gpt-sovits")
PRECISIONS = ("fp32", "fp32-default", "tf32", "bf16", "fp16")
# A workload each target has a recipe for (Lightning takes any).
MODEL_FOR = {
    "3d-speaker": ("cam++", "speaker-verification"),
    "wenet": ("conformer", "asr"),
    "speechbrain": ("ecapa-tdnn", "speaker-verification"),
    "espnet": ("ecapa-tdnn", "speaker-verification"),
    "lightning": ("cam++", "speaker-verification"),
    "amphion": ("naturalspeech2", "tts"),
    "gpt-sovits": ("gpt-sovits-s1", "tts"),
}
TASKS = {
    "cam++": "speaker-verification",
    "eres2net": "speaker-verification",
    "eres2net-large": "speaker-verification",
    "ecapa-tdnn": "speaker-verification",
    "ecapa-tdnn-512": "speaker-verification",
    "conformer": "asr",
    "fastspeech2": "tts",
    "wav2vec2-ctc": "asr",
    "naturalspeech2": "tts",
    "gpt-sovits-s1": "tts",
    "gpt-sovits-s2": "tts",
}


def make_tuned(
    *,
    model: str = "cam++",
    precision: str = "fp32",
    workers: int = 4,
    world_size: int = 1,
    accum: int = 1,
    dynamic: bool = False,
    device_type: str = "cuda",
    fp32_math: dict[str, str] | None = None,
    **overrides: Any,
) -> TunedConfig:
    """A result as `autotune run` writes it, for one model; dynamic batching adds WeNet's frame budget."""
    fields: dict[str, Any] = {
        "per_device_batch_size": 32,
        "num_workers": workers,
        "prefetch_factor": 4,
        "pin_memory": True,
        "persistent_workers": True,
        "precision": precision,
        "world_size": world_size,
        "grad_accum_steps": accum,
        "workload_knobs": {"batch_type": "dynamic", "max_frames_in_batch": 12000} if dynamic else {},
    }
    winner: dict[str, Any] = {"status": "ok", "samples_per_second": 100.0}
    if fp32_math is not None:
        winner["fp32_math"] = fp32_math
    return TunedConfig(
        workload={"name": model, "task": TASKS[model]},
        config=TrialConfig(**(fields | overrides)),
        device_type=device_type,
        metrics={"winner": winner},
        hardware={},
        data={},
        search={},
        created="2025-01-02T03:04:05+00:00",
        autotune_version="0.1.0",
    )


def for_target(target: str, **kwargs: Any) -> TunedConfig:
    return make_tuned(model=MODEL_FOR[target][0], **kwargs)


def with_model(tuned: TunedConfig, model: str) -> TunedConfig:
    return dataclasses.replace(tuned, workload={"name": model, "task": TASKS[model]})


def parsed(result: Export) -> dict[str, Any]:
    assert result.yaml_text is not None
    data = yaml.safe_load(result.yaml_text)
    assert isinstance(data, dict)
    return data


def notes_text(result: Export) -> str:
    return "\n".join(result.notes)


_CAPTURE = 'env -0 > "$ENV_OUT"; printf "%s\\0" "$@" > "$ARGV_OUT"'


def bash_words(command: str | None, cwd: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """What bash makes of a printed command: the variables set before the program, and its argv (program first).

    The command runs in a real bash with the launchers replaced (torchrun and python by shell functions, ESPnet's
    ./run.sh by a script in the working folder) that write what they were given, so quoting, line continuations
    and environment prefixes are read exactly as a user's shell reads them.
    """
    assert command is not None
    with tempfile.TemporaryDirectory() as scratch:
        workdir = cwd or Path(scratch)
        run_sh = workdir / "run.sh"
        if not run_sh.exists():
            run_sh.write_text(f'#!/usr/bin/env bash\nset -- "$0" "$@"; {_CAPTURE}\n')
            run_sh.chmod(0o755)
        stubs = "".join(
            f'{name}() {{ set -- {name} "$@"; {_CAPTURE}; }}; ' for name in ("torchrun", "python", "accelerate")
        )
        env_out, argv_out = Path(scratch) / "env", Path(scratch) / "argv"
        clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ENV_OUT": str(env_out), "ARGV_OUT": str(argv_out)}
        subprocess.run(["bash", "-c", stubs + "\n" + command + "\n"], cwd=workdir, env=clean, check=True)
        environment = dict(item.split("=", 1) for item in env_out.read_text().split("\0") if "=" in item)
        argv = argv_out.read_text().split("\0")[:-1]
    assigned = {key: value for key, value in environment.items() if key not in clean and key not in _BASH_OWN}
    return assigned, argv


_BASH_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}


def option(argv: list[str], flag: str) -> str:
    """The value after `flag` (the last one when repeated)."""
    positions = [index for index, word in enumerate(argv) if word == flag]
    assert positions, f"{flag} not in {argv}"
    return argv[positions[-1] + 1]


def call_kwargs(python_text: str, name: str) -> dict[str, Any]:
    """The literal keyword arguments of the first call to `name` in a snippet."""
    for node in ast.walk(ast.parse(python_text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            return {keyword.arg: _literal(keyword.value) for keyword in node.keywords if keyword.arg}
    raise AssertionError(f"no {name}(...) call")


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


# What cpu_result tunes, as a DataLoader must hold it (batch_size per test).
TUNED = {
    "num_workers": 2,
    "prefetch_factor": 3,
    "persistent_workers": True,
    "in_order": False,
    "pin_memory": False,
    "drop_last": True,
}


def cpu_result(model: str, precision: str, batch: int, **overrides: Any) -> TunedConfig:
    """A CPU result with workers, a prefetch depth, persistent and unordered workers, for the tests that train for
    real (each framework's own DataLoader then holds every tuned loader knob it takes)."""
    fields = {"workers": 2, "prefetch_factor": 3, "pin_memory": False, "per_device_batch_size": batch}
    fields = fields | {"in_order": False} | overrides
    return make_tuned(model=model, precision=precision, device_type="cpu", **fields)


def loader_settings(loader: Any) -> dict[str, Any]:
    """The tuned settings as a framework's DataLoader holds them."""
    names = (
        "batch_size",
        "num_workers",
        "prefetch_factor",
        "persistent_workers",
        "in_order",
        "pin_memory",
        "drop_last",
    )
    return {name: getattr(loader, name) for name in names}


def bucket_tuned(plan: Any, *, model: str = "conformer", **kwargs: Any) -> TunedConfig:
    """A result tuned with batch_type bucket whose winner's trials formed `plan` (a data.buckets.BucketPlan)."""
    knobs = {"batch_type": "bucket", "max_frames_in_batch": 16000, "num_buckets": len(plan.batch_sizes)}
    tuned = make_tuned(model=model, workload_knobs={**knobs, "bucket_scaling": 1.5}, **kwargs)
    winner = {**tuned.metrics["winner"], "epoch_accounting": {"dataset_size": 300, "buckets": plan.to_dict()}}
    return dataclasses.replace(tuned, metrics={**tuned.metrics, "winner": winner})
