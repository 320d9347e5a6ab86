"""Write ``wav2vec2_ctc.json``: SpeechBrain's CommonVoice wav2vec2 CTC model as its own code builds and runs it.

The reference is the recipe's ``modules`` dict (``wav2vec2``, ``enc``, ``ctc_lin`` of
``recipes/CommonVoice/ASR/CTC/hparams/train_fr_with_wav2vec.yaml``), built from the installed packages:
speechbrain's HuggingFace wrapper ``speechbrain.integrations.huggingface.wav2vec2.Wav2Vec2`` around transformers'
``Wav2Vec2Model``, and the head from ``speechbrain.nnet`` classes with the yaml's arguments. Nothing is downloaded:

* the full configuration's state dict and parameter totals come from ``Wav2Vec2Model(Wav2Vec2Config(**FULL))``
  built on the meta device, its keys prefixed ``wav2vec2.model.`` (the wrapper holds the HF model as ``model`` and
  nothing else with a state; checked on the reduced configuration below);
* the reduced configuration's model is saved to a temporary folder (config.json, preprocessor_config.json,
  model.safetensors) and loaded back through speechbrain's own wrapper, which then runs its own forward (wav
  normalisation, padding mask); the head, log-softmax and ``speechbrain.nnet.losses.ctc_loss`` follow the recipe's
  ``compute_forward``/``compute_objectives``. Weights and inputs are the deterministic patterns of
  ``tests/models/reference_state_dicts.py``.

Run from the repository root with transformers installed (it is not a dependency of autotune)::

    HF_HUB_OFFLINE=1 .venv/bin/python -m tests.models.reference.make_wav2vec2_ctc
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import speechbrain
import torch
import transformers
from speechbrain.integrations.huggingface.wav2vec2 import Wav2Vec2
from speechbrain.nnet.activations import Softmax
from speechbrain.nnet.containers import Sequential
from speechbrain.nnet.linear import Linear
from speechbrain.nnet.losses import ctc_loss
from speechbrain.nnet.normalization import BatchNorm1d
from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

from tests.models.reference_state_dicts import REFERENCE_DIR, pattern, pattern_state

# LeBenchmark/wav2vec2-FR-7K-large config.json (hub commit 9b2c1bc, "upload", 2021-08-16): the values that shape
# Wav2Vec2Model or its training forward. Keys the file leaves out take Wav2Vec2Config's defaults.
FULL: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "hidden_act": "gelu",
    "conv_dim": [512] * 7,
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "conv_bias": True,
    "feat_extract_norm": "layer",
    "feat_extract_activation": "gelu",
    "do_stable_layer_norm": True,
    "num_conv_pos_embeddings": 128,
    "num_conv_pos_embedding_groups": 16,
    "layer_norm_eps": 1e-5,
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
    "feat_proj_dropout": 0.1,
    "layerdrop": 0.1,
    "mask_time_prob": 0.075,
    "mask_feature_prob": 0.0,
}
# train_fr_with_wav2vec.yaml: dnn_neurons, output_neurons, dropout, blank_index.
FULL_HEAD = {"dnn_neurons": 1024, "output_neurons": 76, "dropout": 0.15, "blank_index": 0}

# Same code path, small enough for a CPU test: fewer and narrower layers, three feature convolutions, an even
# positional kernel (the SamePad trim), no dropout or layerdrop so that a training-mode forward is deterministic.
REDUCED: dict[str, Any] = {
    **FULL,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "conv_dim": [16, 16, 16],
    "conv_kernel": [10, 3, 3],
    "conv_stride": [5, 2, 2],
    "num_conv_pos_embeddings": 8,
    "num_conv_pos_embedding_groups": 4,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "feat_proj_dropout": 0.0,
    "layerdrop": 0.0,
}
REDUCED_HEAD = {"dnn_neurons": 24, "output_neurons": 10, "dropout": 0.0, "blank_index": 0}

# The reduced batch: three padded waveforms with SpeechBrain relative lengths, and padded token targets.
WAV_SHAPE = (3, 1600)
WAV_SEED = 0.7
WAV_LENS = [1.0, 0.8, 0.55]
TOKENS = [[3, 5, 2, 7, 1, 4], [6, 6, 2, 9, 0, 0], [8, 1, 3, 0, 0, 0]]
TOKEN_LENS = [1.0, 4 / 6, 3 / 6]
# Flat indices into encoder output and log-probabilities that the record keeps (a stride through the tensor).
SAMPLE_COUNT = 24


def head(input_size: int, dnn_neurons: int, output_neurons: int, dropout: float) -> torch.nn.ModuleDict:
    """``enc`` and ``ctc_lin`` as the yaml's ``!new:``/``!name:`` entries build them."""

    def linear(input_shape: list[int | None]) -> Linear:
        return Linear(n_neurons=dnn_neurons, bias=True, input_shape=input_shape)

    enc = Sequential(
        input_shape=[None, None, input_size],
        linear1=linear,
        bn1=BatchNorm1d,
        activation=torch.nn.LeakyReLU(),
        drop=torch.nn.Dropout(p=dropout),
        linear2=linear,
        bn2=BatchNorm1d,
        activation2=torch.nn.LeakyReLU(),
        drop2=torch.nn.Dropout(p=dropout),
        linear3=linear,
        bn3=BatchNorm1d,
        activation3=torch.nn.LeakyReLU(),
    )
    ctc_lin = Linear(input_size=dnn_neurons, n_neurons=output_neurons)
    return torch.nn.ModuleDict({"enc": enc, "ctc_lin": ctc_lin})


def full_state_dict() -> tuple[list[list[Any]], dict[str, int]]:
    with torch.device("meta"):
        encoder = Wav2Vec2Model(Wav2Vec2Config(**FULL))
    modules = head(FULL["hidden_size"], FULL_HEAD["dnn_neurons"], FULL_HEAD["output_neurons"], FULL_HEAD["dropout"])
    state = [[f"wav2vec2.model.{key}", list(value.shape)] for key, value in encoder.state_dict().items()]
    state += [[key, list(value.shape)] for key, value in modules.state_dict().items()]
    parts = {"wav2vec2": sum(p.numel() for p in encoder.parameters() if p.requires_grad)}
    parts |= {name: sum(p.numel() for p in module.parameters()) for name, module in modules.items()}
    return state, parts


def reduced_modules(folder: Path) -> torch.nn.ModuleDict:
    """The recipe's modules at the reduced size, the encoder loaded through speechbrain's wrapper from ``folder``."""
    Wav2Vec2Model(Wav2Vec2Config(**REDUCED)).save_pretrained(folder)
    # do_normalize as in LeBenchmark's large models' preprocessor_config.json (3K-large's read; 7K-large's not found).
    Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=True).save_pretrained(folder)
    wav2vec2 = Wav2Vec2(str(folder), save_path=str(folder / "save"), output_norm=False, freeze=False)
    wav2vec2.model.config._attn_implementation = "eager"  # the plain formula; sdpa agrees to float rounding
    modules = head(REDUCED["hidden_size"], REDUCED_HEAD["dnn_neurons"], REDUCED_HEAD["output_neurons"], 0.0)
    return torch.nn.ModuleDict({"wav2vec2": wav2vec2, **modules})


def samples(tensor: torch.Tensor) -> dict[str, Any]:
    flat = tensor.detach().double().flatten()
    stride = max(1, flat.numel() // SAMPLE_COUNT)
    return {
        "shape": list(tensor.shape),
        "mean": float(flat.mean()),
        "std": float(flat.std()),
        "stride": stride,
        "values": [float(v) for v in flat[::stride][:SAMPLE_COUNT]],
    }


def run(modules: torch.nn.ModuleDict, train: bool) -> dict[str, Any]:
    """The recipe's compute_forward and compute_objectives (no waveform augmentation) on the pattern batch."""
    modules.train(train)
    modules.zero_grad()
    wavs = pattern(WAV_SHAPE, WAV_SEED, scale=1.0)
    wav_lens = torch.tensor(WAV_LENS)
    valid = torch.arange(WAV_SHAPE[1]) < torch.round(wav_lens * WAV_SHAPE[1]).unsqueeze(1)
    wavs = wavs * valid  # padding is zeros, as SpeechBrain's PaddedBatch leaves it
    feats = modules["wav2vec2"](wavs, wav_lens)
    logits = modules["ctc_lin"](modules["enc"](feats))
    p_ctc = Softmax(apply_log=True)(logits)
    loss = ctc_loss(p_ctc, torch.tensor(TOKENS), wav_lens, torch.tensor(TOKEN_LENS), blank_index=0)
    record = {"encoder_out": samples(feats), "log_probs": samples(p_ctc), "loss": float(loss.detach())}
    if train:
        loss.backward()
        record["grad_norms"] = {
            name: float(p.grad.double().norm()) for name, p in modules.named_parameters() if p.grad is not None
        }
        record["no_grad"] = [name for name, p in modules.named_parameters() if p.grad is None]
        record["running_mean_bn1"] = [float(v) for v in modules["enc"]["bn1"].norm.running_mean[:8]]
    return record


def reduced_record() -> dict[str, Any]:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        modules = reduced_modules(Path(folder))
        hf_keys = [f"model.{key}" for key in modules["wav2vec2"].model.state_dict()]
        assert list(modules["wav2vec2"].state_dict()) == hf_keys, "the wrapper adds state of its own"
        modules.load_state_dict(pattern_state(modules.state_dict()), strict=True)
        normalize = bool(modules["wav2vec2"].normalize_wav)
        train = run(modules, train=True)
        # Reload so that eval sees the pattern running statistics, not those the training forward updated.
        modules.load_state_dict(pattern_state(modules.state_dict()), strict=True)
        with torch.no_grad():
            evaluation = run(modules, train=False)
    return {
        "encoder": REDUCED,
        "head": REDUCED_HEAD,
        "normalize_wav": normalize,
        "inputs": {
            "wav_shape": list(WAV_SHAPE),
            "wav_seed": WAV_SEED,
            "wav_lens": WAV_LENS,
            "tokens": TOKENS,
            "token_lens": TOKEN_LENS,
        },
        "train": train,
        "eval": evaluation,
    }


def main() -> None:
    state, parts = full_state_dict()
    record = {
        "repository": "speechbrain/speechbrain",
        "commit": "9c826ef3937bac885c8a6ca86c6889a30f256fb5",
        "release": "v1.0.0 (a8b67d9e8f9962b410092e002a70ab30abeb0686): same modules, wrapper forward and ctc_loss",
        "files": [
            "recipes/CommonVoice/ASR/CTC/train_with_wav2vec.py",
            "recipes/CommonVoice/ASR/CTC/hparams/train_fr_with_wav2vec.yaml",
            "speechbrain/integrations/huggingface/wav2vec2.py",
            "speechbrain/integrations/huggingface/huggingface.py",
            "speechbrain/nnet/containers.py",
            "speechbrain/nnet/linear.py",
            "speechbrain/nnet/normalization.py",
            "speechbrain/nnet/losses.py",
        ],
        "hub_model": "LeBenchmark/wav2vec2-FR-7K-large (config.json at hub commit 9b2c1bc; weights not used)",
        "packages": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "speechbrain": speechbrain.__version__,
        },
        "how": (
            "tests/models/reference/make_wav2vec2_ctc.py: the full state dict from Wav2Vec2Model(Wav2Vec2Config(FULL)) "
            "on the meta device, keys prefixed 'wav2vec2.model.' (speechbrain's wrapper adds no state: checked on "
            "the reduced model), then the head's; the reduced outputs from speechbrain's own Wav2Vec2 wrapper loading "
            "a saved reduced model, the head, log-softmax and speechbrain's ctc_loss, with pattern_state weights. "
            "'train': training mode with the reduced configuration's zero dropout and layerdrop (BatchNorm on batch "
            "statistics, then backward); 'eval': evaluation mode, pattern running statistics."
        ),
        "config": {"encoder": FULL, "head": FULL_HEAD},
        "trainable_parameters": sum(parts.values()),
        "parts": parts,
        "state_dict": state,
        "reduced": reduced_record(),
    }
    path = REFERENCE_DIR / "wav2vec2_ctc.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}: {record['trainable_parameters']:,} trainable parameters")


if __name__ == "__main__":
    main()
