"""Write naturalspeech2.json by running Amphion's own NaturalSpeech2 code at a pinned commit.

It needs a local clone (a bare one will do) of https://github.com/open-mmlab/Amphion holding ``COMMIT``, the source of
the ``encodec`` package Amphion imports, at version 0.1.1 (``pip download --no-deps encodec==0.1.1`` and unpack it:
the folder that holds ``encodec/``), and the project's virtual environment (torch, numpy, einops, torchaudio).
Run from the repository root::

    .venv/bin/python -m tests.models.reference.make_naturalspeech2 /path/to/Amphion/.git /path/to/encodec-0.1.1

The commit's ``models/tts/naturalspeech2``, ``modules/naturalpseech2``, ``config/ns2.json`` and
``egs/tts/NaturalSpeech2`` are exported (``git archive``) into a temporary folder and imported from there unchanged.
Two things are replaced, neither part of the model's construction or training forward:

* ``EncodecModel.encodec_model_24khz`` is called with ``pretrained=False``, so that no checkpoint is downloaded: the
  quantizer has EnCodec's shapes, and `pattern_state` fills its codebooks;
* Amphion's config loader (``utils.util.load_config``, json5 and the rest of ``utils``) is not imported: the same
  override of ``config/ns2.json`` by ``exp_config_base.json`` and ``exp_config.json`` is done here, and the model
  section handed over as attribute namespaces (what ``JsonHParams`` gives).

``NS2Trainer`` is not imported either (accelerate, diffusers, the data pipeline): its ``_train_step``'s loss lines
are run here as written, with ``ns2_loss.py``'s functions and the model's ``code_to_latent``/``latent_to_code``.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from io import BytesIO
from pathlib import Path
from typing import Any

import torch

from autotune.models.naturalspeech2 import NS2_REDUCED
from tests.models.reference_state_dicts import REFERENCE_DIR, pattern_state
from tests.models.test_naturalspeech2 import (
    DURATIONS,
    PHONES,
    PROMPT_PHONES,
    amphion_model_section,
    full_rank_pattern_state,
    reduced_batch,
)

REPOSITORY = "open-mmlab/Amphion"
COMMIT = "d3de90f02e7f1c7dbc24b04d52fe1b8ef438effe"
CONFIGS = ["config/ns2.json", "egs/tts/NaturalSpeech2/exp_config_base.json", "egs/tts/NaturalSpeech2/exp_config.json"]
FILES = [
    "models/tts/naturalspeech2/ns2.py",
    "models/tts/naturalspeech2/prior_encoder.py",
    "models/tts/naturalspeech2/diffusion.py",
    "models/tts/naturalspeech2/diffusion_flow.py",
    "models/tts/naturalspeech2/wavenet.py",
    "models/tts/naturalspeech2/ns2_loss.py",
    "models/tts/naturalspeech2/ns2_trainer.py",
    "modules/naturalpseech2/transformers.py",
    *CONFIGS,
]
ENCODEC = "encodec 0.1.1 (PyPI), quantization/core_vq.py and vq.py, model.py"
SEED = 20240
WEIGHTS_HOW = {
    "pattern": "every tensor set by tests/models/reference_state_dicts.pattern_state (the codebooks included)",
    "full_rank_pattern": (
        "every tensor set by tests/models/test_naturalspeech2.full_rank_pattern_state: pattern_state's values, "
        "those of learned tensors of 2 or more dimensions at amplitude 1.0 and in a scrambled order (pattern_state's "
        "matrices have rank 2 and leave attention nearly uniform, hiding masking errors)"
    ),
}


def merged_config(root: Path) -> dict[str, Any]:
    """CONFIGS, each overriding the one before key by key, as Amphion's load_config follows ``base_config``."""

    def override(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in new.items():
            out[key] = (
                override(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
            )
        return out

    merged: dict[str, Any] = {}
    for name in CONFIGS:
        text = re.sub(r"^\s*//.*$", "", (root / name).read_text(), flags=re.MULTILINE)  # json5 comments
        merged = override(merged, json.loads(text))
    return merged


def namespace(section: dict[str, Any]) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v for k, v in section.items()})


def export(git_dir: str, into: Path) -> None:
    """Extract the reference's model code and configurations at COMMIT (git fails if the clone lacks it)."""
    paths = ["models/tts/naturalspeech2", "modules/naturalpseech2", *CONFIGS]
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", COMMIT, *paths], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def train_step_losses(model: Any, batch: dict[str, torch.Tensor], train: types.SimpleNamespace) -> dict[str, float]:
    """The loss lines of NS2Trainer._train_step (diffusion_type "diffusion"), on the unwrapped model."""
    from models.tts.naturalspeech2.ns2_loss import diff_ce_loss, diff_loss, log_dur_loss, log_pitch_loss

    diff_out, prior_out = model(**batch)
    code, mask = batch["code"], batch["mask"]
    losses = {
        "pitch_loss": log_pitch_loss(prior_out["pitch_pred_log"], batch["pitch"], mask=mask),
        "dur_loss": log_dur_loss(prior_out["dur_pred_log"], batch["duration"], mask=batch["phone_mask"]),
    }
    x0 = model.code_to_latent(code)
    losses["diff_loss_x0"] = diff_loss(diff_out["x0_pred"], x0, mask=mask)
    losses["diff_loss_noise"] = diff_loss(diff_out["noise_pred"], diff_out["noise"], mask=mask)
    _, pred_dist = model.latent_to_code(diff_out["x0_pred"], nq=code.shape[1])
    gt_indices, _ = model.latent_to_code(x0, nq=code.shape[1])
    losses["diff_loss_ce"] = diff_ce_loss(pred_dist, gt_indices, mask=mask)
    losses["total"] = (
        losses["pitch_loss"]
        + losses["dur_loss"]
        + losses["diff_loss_x0"]
        + losses["diff_loss_noise"] * train.diff_noise_loss_lambda
        + losses["diff_loss_ce"] * train.diff_ce_loss_lambda
    )
    return {name: float(value) for name, value in losses.items()}


def reduced_outputs(model: Any, weights: str, train: types.SimpleNamespace) -> tuple[dict[str, Any], list[float]]:
    fill = pattern_state if weights == "pattern" else full_rank_pattern_state
    model.load_state_dict(fill(model.state_dict()), strict=True)
    times: list[torch.Tensor] = []
    handle = model.diffusion.diff_estimator.register_forward_pre_hook(lambda module, args: times.append(args[3]))
    torch.manual_seed(SEED)
    with torch.no_grad():
        losses = train_step_losses(model, reduced_batch(), train)
    handle.remove()
    return {"how": WEIGHTS_HOW[weights], **losses}, times[0].tolist()


def record(root: Path, encodec_root: str) -> dict[str, Any]:
    """Build and run the reference exported under ``root``; return the record."""
    sys.path[:0] = [str(root), encodec_root]
    warnings.filterwarnings("ignore", category=FutureWarning)  # weight_norm, in EnCodec's SEANet
    import encodec

    build_24khz = encodec.EncodecModel.encodec_model_24khz
    encodec.EncodecModel.encodec_model_24khz = staticmethod(lambda *args, **kwargs: build_24khz(pretrained=False))
    from models.tts.naturalspeech2.ns2 import NaturalSpeech2  # the reference's own module

    config = merged_config(root)
    torch.manual_seed(0)
    model = NaturalSpeech2(namespace(config["model"]))
    state = model.state_dict()
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)

    reduced_model = amphion_model_section(NS2_REDUCED)
    small = NaturalSpeech2(namespace(reduced_model)).eval()
    train = namespace(config["train"])
    weights, times = {}, []
    for name in WEIGHTS_HOW:
        weights[name], times = reduced_outputs(small, name, train)
    batch = reduced_batch()
    return {
        "repository": REPOSITORY,
        "commit": COMMIT,
        "files": FILES,
        "codec": ENCODEC,
        "configuration": {"model": config["model"], "train": config["train"]},
        "packages": {"python": platform.python_version(), "torch": torch.__version__, "encodec": encodec.__version__},
        "how": (
            "state_dict() of Amphion's NaturalSpeech2(cfg.model) built from config/ns2.json overridden by "
            "egs/tts/NaturalSpeech2/exp_config_base.json and exp_config.json, its code unpatched (exported by git "
            "archive), by tests/models/reference/make_naturalspeech2.py. Stubbed: EncodecModel.encodec_model_24khz "
            "is called with pretrained=False (no checkpoint download; the quantizer's 32 codebooks of 1024 x 128 are "
            "the same buffers, zeros until filled); Amphion's json5 config loader is replaced by the same recursive "
            "override, the model section passed as SimpleNamespace. trainable_parameters counts requires_grad "
            "parameters once each (the phone embedding is in the state dict twice, under prior_encoder and "
            "prior_encoder.encoder)."
        ),
        "trainable_parameters": trainable,
        "state_dict": [[key, list(value.shape)] for key, value in state.items()],
        "reduced": {
            "how": (
                "The same class with the model section 'model' (tests/models/test_naturalspeech2.amphion_model_"
                "section(NS2_REDUCED)), in eval mode (no dropout), with the weights each entry of 'weights' says, "
                "on tests/models/test_naturalspeech2.reduced_batch() (PHONES/DURATIONS with pattern codes and pitch, "
                "the first PROMPT_PHONES phones cut off as the prompt, padded as NS2Collator pads); torch.manual_seed"
                "(seed) right before the forward, so Diffusion.forward's torch.rand(B) and torch.randn draw the same "
                "time ('diffusion_time', after the clamp, captured by a forward pre-hook on diff_estimator) and noise "
                "in ours. The terms are NS2Trainer._train_step's, run with ns2_loss.py's functions; total weights "
                "them by train.diff_noise_loss_lambda and train.diff_ce_loss_lambda."
            ),
            "model": reduced_model,
            "phones": PHONES,
            "durations": DURATIONS,
            "prompt_phones": PROMPT_PHONES,
            "batch_shapes": {key: list(value.shape) for key, value in batch.items()},
            "seed": SEED,
            "diffusion_time": times,
            "weights": weights,
        },
    }


def main(git_dir: str, encodec_root: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        export(git_dir, Path(folder))
        data = record(Path(folder), encodec_root)
    path = REFERENCE_DIR / "naturalspeech2.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    totals = {name: entry["total"] for name, entry in data["reduced"]["weights"].items()}
    print(f"wrote {path}: {data['trainable_parameters']:,} trainable parameters, reduced totals {totals}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
