"""Write gpt_sovits_s1_v2.json by running GPT-SoVITS's own s1 model code at a pinned commit.

It needs a local clone (a bare one will do) of https://github.com/RVC-Boss/GPT-SoVITS holding ``COMMIT``, and the
project's virtual environment, which has what the reference's model imports (torch, torchmetrics, tqdm, PyYAML).
Run from the repository root::

    .venv/bin/python -m tests.models.reference.make_gpt_sovits_s1 /path/to/GPT-SoVITS/.git

The commit's ``GPT_SoVITS/AR`` and ``configs/s1longer-v2.yaml`` are exported (``git archive``) into a temporary folder
and imported from there unchanged: nothing is stubbed or patched. The record holds the state dict layout and
trainable total of the s1longer-v2 configuration as ``Text2SemanticLightningModule`` builds it
(``Text2SemanticDecoder(config, top_k=3)``), and the loss, accuracy and logits of the reference's training forward
(``forward_old``) for a reduced configuration in eval mode on `pattern` inputs, with `pattern_state` weights and
with the full-rank variant of tests/models/test_gpt_sovits_s1.py.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tarfile
import tempfile
import warnings
from io import BytesIO
from pathlib import Path
from typing import Any

import torch
import torchmetrics
import yaml

from tests.models.reference_state_dicts import REFERENCE_DIR, full_rank_pattern_state, pattern_state
from tests.models.test_gpt_sovits_s1 import bert_features

REPOSITORY = "RVC-Boss/GPT-SoVITS"
COMMIT = "48b1a0169a28582a8984402f82cf438d3bfa6aca"
CONFIG = "GPT_SoVITS/configs/s1longer-v2.yaml"
FILES = [
    "GPT_SoVITS/AR/models/t2s_model.py",
    "GPT_SoVITS/AR/models/t2s_lightning_module.py",
    "GPT_SoVITS/AR/models/utils.py",
    "GPT_SoVITS/AR/modules/embedding.py",
    "GPT_SoVITS/AR/modules/transformer.py",
    "GPT_SoVITS/AR/modules/activation.py",
    "GPT_SoVITS/AR/modules/patched_mha_with_cache.py",
    "GPT_SoVITS/AR/data/dataset.py",
    CONFIG,
]

REDUCED = {
    "vocab_size": 17,
    "phoneme_vocab_size": 23,
    "embedding_dim": 32,
    "hidden_dim": 32,
    "head": 2,
    "n_layer": 2,
    "dropout": 0,
    "EOS": 16,
}
# Right-padded as the recipe's collate pads them: phones with 0, semantic ids with the PAD value (EOS).
PHONEME_IDS = [[3, 7, 11, 19, 22], [5, 9, 2, 0, 0]]
PHONEME_LENGTHS = [5, 3]
SEMANTIC_IDS = [[1, 4, 9, 15, 0, 2, 7], [11, 3, 6, 8, 16, 16, 16]]
SEMANTIC_LENGTHS = [7, 4]
BERT_HOW = "pattern((2, 1024, 5), 0.7, scale=1.0), zero past each item's phones (as the collate pads it)"
WEIGHTS_HOW = {
    "pattern": "every tensor set by tests/models/reference_state_dicts.pattern_state",
    "full_rank_pattern": (
        "every tensor set by tests/models/reference_state_dicts.full_rank_pattern_state: pattern_state's values, "
        "those of tensors of 2 or more dimensions at amplitude 1.0 and in a scrambled order (pattern_state's "
        "matrices have rank 2 and leave attention nearly uniform, so that masking errors move the loss by less "
        "than 1e-5; these move it by about 1%)"
    ),
}


def reduced_inputs() -> tuple[torch.Tensor, ...]:
    """The reduced configuration's batch: phoneme ids and lengths, semantic ids and lengths, BERT features."""
    lengths = torch.tensor(PHONEME_LENGTHS)
    return (
        torch.tensor(PHONEME_IDS),
        lengths,
        torch.tensor(SEMANTIC_IDS),
        torch.tensor(SEMANTIC_LENGTHS),
        bert_features(lengths),
    )


def reduced_outputs(model: torch.nn.Module, weights: str) -> dict[str, Any]:
    """forward_old's loss and accuracy and the logits (ar_predict_layer's output) for the given weights."""
    fill = pattern_state if weights == "pattern" else full_rank_pattern_state
    model.load_state_dict(fill(model.state_dict()), strict=True)
    captured: list[torch.Tensor] = []
    handle = model.ar_predict_layer.register_forward_hook(lambda module, args, output: captured.append(output))
    with torch.no_grad():
        loss, accuracy = model.forward_old(*reduced_inputs())
    handle.remove()
    logits = [[[round(value, 6) for value in row] for row in item] for item in captured[0].tolist()]
    return {"how": WEIGHTS_HOW[weights], "logits": logits, "loss": float(loss), "accuracy": float(accuracy)}


def export(git_dir: str, into: Path) -> None:
    """Extract the reference's model package and configuration at COMMIT (git fails if the clone lacks it)."""
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", COMMIT, "GPT_SoVITS/AR", CONFIG], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def record(root: Path) -> dict[str, Any]:
    """Build and run the reference exported under ``root``; return the record."""
    sys.path.insert(0, str(root / "GPT_SoVITS"))
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit.script at the reference's import
    from AR.models.t2s_model import Text2SemanticDecoder  # the reference's own module

    config = yaml.safe_load((root / CONFIG).read_text())
    torch.manual_seed(0)
    model = Text2SemanticDecoder(config=config, top_k=3)
    state = model.state_dict()
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)

    small = Text2SemanticDecoder(config={**config, "model": {**config["model"], **REDUCED}}, top_k=3).eval()
    return {
        "repository": REPOSITORY,
        "commit": COMMIT,
        "files": FILES,
        "configuration": {key: config["model"][key] for key in config["model"]},
        "packages": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchmetrics": torchmetrics.__version__,
        },
        "how": (
            "state_dict() of GPT-SoVITS's Text2SemanticDecoder(config, top_k=3) as Text2SemanticLightningModule "
            f"builds it from {CONFIG}, its own code unpatched and unstubbed "
            "(exported by git archive; torchmetrics, tqdm and PyYAML from the project's venv), by "
            "tests/models/reference/make_gpt_sovits_s1.py. The sine position tables are plain attributes there, "
            "not in the state dict; the Lightning checkpoints prefix every key with 'model.'. trainable_parameters "
            "counts requires_grad parameters (the two position alphas included)."
        ),
        "trainable_parameters": trainable,
        "state_dict": [[key, list(value.shape)] for key, value in state.items()],
        "reduced": {
            "how": (
                "The same class with the model section's "
                + ", ".join(f"{key} {value}" for key, value in REDUCED.items())
                + ", in eval mode (no dropout), with the weights each entry of 'weights' says; "
                f"forward_old (the training step's forward without if_dpo) on bert_feature = {BERT_HOW}; "
                "logits are the output of ar_predict_layer, captured by a forward hook."
            ),
            "model": REDUCED,
            "phoneme_ids": PHONEME_IDS,
            "phoneme_lengths": PHONEME_LENGTHS,
            "semantic_ids": SEMANTIC_IDS,
            "semantic_lengths": SEMANTIC_LENGTHS,
            "weights": {weights: reduced_outputs(small, weights) for weights in WEIGHTS_HOW},
        },
    }


def main(git_dir: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        export(git_dir, Path(folder))
        data = record(Path(folder))
    path = REFERENCE_DIR / "gpt_sovits_s1_v2.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    losses = [entry["loss"] for entry in data["reduced"]["weights"].values()]
    print(f"wrote {path}: {data['trainable_parameters']:,} trainable parameters, reduced losses {losses}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
