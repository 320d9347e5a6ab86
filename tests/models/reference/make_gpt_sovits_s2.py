"""Write gpt_sovits_s2_v2.json by running GPT-SoVITS's own s2 model code at a pinned commit.

It needs a local clone (a bare one will do) of https://github.com/RVC-Boss/GPT-SoVITS holding ``COMMIT``, and the
project's virtual environment, which has what the reference's model code imports (torch, numpy, einops, tqdm,
librosa for the mel filters). Run from the repository root::

    .venv/bin/python -m tests.models.reference.make_gpt_sovits_s2 /path/to/GPT-SoVITS/.git

The commit's ``GPT_SoVITS/module``, ``text/symbols*.py`` and ``configs/s2.json`` are exported (``git archive``) into
a temporary folder and imported from there unchanged. One stub: ``f5_tts.model.DiT``, which ``module/models.py``
imports for the v3 model only. The quantizer's k-means initialisation calls ``torch.distributed`` (rank,
broadcast), so a one-process gloo group is started, as s2_train.py starts one per GPU.

The record holds the state dict layouts and parameter totals of net_g (``SynthesizerTrn``) and net_d
(``MultiPeriodDiscriminator``) as s2_train.py builds them from s2.json for v2, and, for a reduced configuration
with deterministic weights and inputs and a fixed seed, the loss terms of one training step: s2_train.py's
``train_and_evaluate`` body restated line for line (its loop is not importable) with the reference's own
``losses``, ``mel_processing`` and ``commons`` functions, fp32, both models in eval mode (no dropout).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tarfile
import tempfile
import types
import warnings
from io import BytesIO
from pathlib import Path
from typing import Any

import librosa
import torch
import torch.distributed as dist

from tests.models.reference_state_dicts import REFERENCE_DIR, full_rank_pattern_state, pattern_state
from tests.models.test_gpt_sovits_s2 import (
    ADAMW,
    CODEBOOK,
    PROJECTION_SCALE,
    REDUCED_MODEL,
    REDUCED_STEP,
    SEED,
    reduced_batch,
)

REPOSITORY = "RVC-Boss/GPT-SoVITS"
COMMIT = "48b1a0169a28582a8984402f82cf438d3bfa6aca"
CONFIG = "GPT_SoVITS/configs/s2.json"
FILES = [
    "GPT_SoVITS/module/models.py",
    "GPT_SoVITS/module/modules.py",
    "GPT_SoVITS/module/attentions.py",
    "GPT_SoVITS/module/commons.py",
    "GPT_SoVITS/module/mrte_model.py",
    "GPT_SoVITS/module/quantize.py",
    "GPT_SoVITS/module/core_vq.py",
    "GPT_SoVITS/module/losses.py",
    "GPT_SoVITS/module/mel_processing.py",
    "GPT_SoVITS/s2_train.py",
    CONFIG,
]
EXPORTED = ["GPT_SoVITS/module", "GPT_SoVITS/text/__init__.py", "GPT_SoVITS/text/symbols.py"]
EXPORTED += ["GPT_SoVITS/text/symbols2.py", CONFIG]
WEIGHTS_HOW = {
    "pattern": "every tensor set by tests/models/reference_state_dicts.pattern_state; codebook as the entry says",
    "full_rank_pattern": (
        "every tensor set by tests/models/reference_state_dicts.full_rank_pattern_state (pattern_state's values, "
        "tensors of 2 or more dimensions at amplitude 1.0 and scrambled); codebook as the entry says"
    ),
}


def export(git_dir: str, into: Path) -> None:
    """Extract the reference's s2 model package, symbol tables and config at COMMIT, and the f5_tts stub."""
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", COMMIT, *EXPORTED], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    f5_tts = types.ModuleType("f5_tts")
    f5_tts_model = types.ModuleType("f5_tts.model")
    f5_tts_model.DiT = type("DiT", (), {})  # type: ignore[attr-defined]  # v3's model, never built for v2
    sys.modules.update({"f5_tts": f5_tts, "f5_tts.model": f5_tts_model})


def totals(model: torch.nn.Module) -> dict[str, int]:
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "buffers": sum(b.numel() for b in model.buffers()),
    }


def grad_norm(parameters: Any) -> float:
    """commons.clip_grad_value_(parameters, None): the L2 norm over every gradient present."""
    return float(sum(float(p.grad.norm(2)) ** 2 for p in parameters if p.grad is not None) ** 0.5)


def reduced_step(net_g: torch.nn.Module, net_d: torch.nn.Module, codebook: str) -> dict[str, Any]:
    """One discriminator step (with its AdamW update) and the generator step's losses and gradients."""
    from module import commons
    from module.losses import discriminator_loss, feature_loss, generator_loss, kl_loss
    from module.mel_processing import mel_spectrogram_torch, spec_to_mel_torch

    step = REDUCED_STEP
    ssl, spec, spec_lengths, text, text_lengths, y = reduced_batch()
    optim_d = torch.optim.AdamW(net_d.parameters(), ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
    torch.manual_seed(SEED)
    y_hat, kl_ssl, ids_slice, x_mask, z_mask, (z, z_p, m_p, logs_p, m_q, logs_q), stats_ssl = net_g(
        ssl, spec, spec_lengths, text, text_lengths
    )
    codes = net_g.quantizer.vq.layers[0]._codebook
    mel = spec_to_mel_torch(spec, step["filter_length"], step["n_mel_channels"], step["sampling_rate"], 0.0, None)
    segment_frames = step["segment_size"] // step["hop_length"]
    y_mel = commons.slice_segments(mel, ids_slice, segment_frames)
    y_hat_mel = mel_spectrogram_torch(
        y_hat.squeeze(1), step["filter_length"], step["n_mel_channels"], step["sampling_rate"],
        step["hop_length"], step["win_length"], 0.0, None,
    )  # fmt: skip
    y = commons.slice_segments(y, ids_slice * step["hop_length"], step["segment_size"])
    y_d_hat_r, y_d_hat_g, _, _ = net_d(y, y_hat.detach())
    loss_disc, _, _ = discriminator_loss(y_d_hat_r, y_d_hat_g)
    optim_d.zero_grad()
    loss_disc.backward()
    grad_norm_d = grad_norm(net_d.parameters())
    optim_d.step()

    y_d_hat_r, y_d_hat_g, fmap_r, fmap_g = net_d(y, y_hat)
    loss_mel = torch.nn.functional.l1_loss(y_mel, y_hat_mel) * step["c_mel"]
    loss_kl = kl_loss(z_p, logs_q, m_p, logs_p, z_mask) * step["c_kl"]
    loss_fm = feature_loss(fmap_r, fmap_g)
    loss_gen, _ = generator_loss(y_d_hat_g)
    loss_gen_all = loss_gen + loss_fm + loss_mel + kl_ssl * 1 + loss_kl
    net_g.zero_grad()
    loss_gen_all.backward()
    return {
        "codebook": CODEBOOK[codebook],
        "ids_slice": ids_slice.tolist(),
        "codes": net_g.quantizer.encode(net_g.ssl_proj(ssl))[0].tolist(),
        "codebook_sum": float(codes.embed.double().sum()),
        "cluster_size_sum": float(codes.cluster_size.sum()),
        "losses": {
            "disc": float(loss_disc.detach()),
            "gen": float(loss_gen.detach()),
            "fm": float(loss_fm.detach()),
            "mel": float(loss_mel.detach()),
            "kl_ssl": float(kl_ssl.detach()),
            "kl": float(loss_kl.detach()),
            "gen_all": float(loss_gen_all.detach()),
        },
        "grad_norm_d": grad_norm_d,
        "grad_norm_g": grad_norm(net_g.parameters()),
        "no_gradient": [name for name, p in net_g.named_parameters() if p.grad is None],
    }


def reduced_record(synthesizer: type, discriminator: type, config: dict[str, Any]) -> dict[str, Any]:
    """Build the reduced pair, fill the weights each way, and run the step."""
    kwargs = {**config["model"], **REDUCED_MODEL}
    results = {}
    for weights, codebook in (("pattern", "pattern"), ("full_rank_pattern", "kmeans")):
        torch.manual_seed(0)
        net_g = synthesizer(1025, REDUCED_STEP["segment_size"] // REDUCED_STEP["hop_length"], **kwargs).eval()
        net_d = discriminator(False, version="v2").eval()
        fill = pattern_state if weights == "pattern" else full_rank_pattern_state
        for net in (net_g, net_d):
            net.load_state_dict(fill(net.state_dict()), strict=True)
        with torch.no_grad():
            for projection in (net_g.enc_p.proj, net_g.enc_q.proj):
                projection.weight.mul_(PROJECTION_SCALE)
                projection.bias.mul_(PROJECTION_SCALE)
            net_g.quantizer.vq.layers[0]._codebook.inited.fill_(0.0 if codebook == "kmeans" else 1.0)
        results[weights] = {"how": WEIGHTS_HOW[weights], **reduced_step(net_g, net_d, codebook)}
    return results


def record(root: Path) -> dict[str, Any]:
    sys.path.insert(0, str(root / "GPT_SoVITS"))
    warnings.filterwarnings("ignore")
    from module.models import MultiPeriodDiscriminator, SynthesizerTrn  # the reference's own modules

    config = json.loads((root / CONFIG).read_text())
    data, model = config["data"], config["model"]
    with torch.device("meta"):
        net_g = SynthesizerTrn(
            data["filter_length"] // 2 + 1,
            config["train"]["segment_size"] // data["hop_length"],
            n_speakers=data["n_speakers"],
            **model,
            version="v2",
        )
        net_d = MultiPeriodDiscriminator(model["use_spectral_norm"], version="v2")
    parts = {name: sum(p.numel() for p in child.parameters()) for name, child in net_g.named_children()}
    return {
        "repository": REPOSITORY,
        "commit": COMMIT,
        "files": FILES,
        "configuration": {"train": config["train"], "data": data, "model": model, "version": "v2"},
        "packages": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "librosa": librosa.__version__,
        },
        "how": (
            "state_dict() of GPT-SoVITS's SynthesizerTrn(filter_length // 2 + 1, segment_size // hop_length, "
            "n_speakers=..., **model, version='v2') and MultiPeriodDiscriminator(use_spectral_norm, version='v2') "
            f"as s2_train.py builds them from {CONFIG} (the webui sets version v2), on the meta device, by "
            "tests/models/reference/make_gpt_sovits_s2.py. Every parameter has requires_grad at construction "
            "and s2_train.py freezes none: 'freeze_quantizer' only sets eval mode on ssl_proj and the quantizer "
            "(whose codebook is buffers), so ssl_proj's parameters are in the optimizer but get no gradient "
            "(see reduced.*.no_gradient)."
        ),
        "net_g": {
            **totals(net_g),
            "parts": parts,
            "state_dict": [[k, list(v.shape)] for k, v in net_g.state_dict().items()],
        },
        "net_d": {**totals(net_d), "state_dict": [[k, list(v.shape)] for k, v in net_d.state_dict().items()]},
        "reduced": {
            "how": (
                "SynthesizerTrn(1025, segment_size // hop_length, **model) with the model entries overridden by "
                "'model', MultiPeriodDiscriminator(False, version='v2'), both in eval mode (the quantizer is in "
                "eval mode in training too; eval only removes dropout). Weights per entry of 'weights', then the "
                "weights and biases of enc_p.proj and enc_q.proj multiplied by 'projection_scale' (so that the "
                "log-scales stay within a few units and the KL finite), the codebook's 'inited' buffer set to 1 "
                "(pattern codebook) or 0 (k-means on the first forward). "
                f"torch.manual_seed({SEED}) right before net_g's forward: the k-means draws, the posterior's "
                "noise and rand_slice_segments come from it in that order. Inputs: tests/models/"
                "test_gpt_sovits_s2.reduced_batch. The step: net_d on (real, generated.detach()), "
                "discriminator_loss, backward, AdamW step (lr, betas, eps as 'adamw', weight decay torch's "
                "default 0.01, as s2_train.py leaves it), then net_d on (real, generated) and the generator "
                "losses as s2_train.py sums them, and their backward. grad_norm_* are commons.clip_grad_value_"
                "(params, None) of each backward (before the D update for D)."
            ),
            "model": REDUCED_MODEL,
            "step": REDUCED_STEP,
            "adamw": ADAMW,
            "seed": SEED,
            "projection_scale": PROJECTION_SCALE,
            "weights": reduced_record(SynthesizerTrn, MultiPeriodDiscriminator, config),
        },
    }


def main(git_dir: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        export(git_dir, Path(folder))
        dist.init_process_group("gloo", init_method=f"file://{folder}/group", rank=0, world_size=1)
        try:
            data = record(Path(folder))
        finally:
            dist.destroy_process_group()
    path = REFERENCE_DIR / "gpt_sovits_s2_v2.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    losses = {weights: entry["losses"] for weights, entry in data["reduced"]["weights"].items()}
    print(f"wrote {path}: net_g {data['net_g']['parameters']:,}, net_d {data['net_d']['parameters']:,}; {losses}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
