"""Activation checkpointing: which workloads recompute activations in backward, and how the search trades it for a
larger batch.

Checkpointing keeps fewer activations for backward and recomputes them there: less memory per sample, more compute
per step. On a GPU whose memory caps the batch, that can let a larger batch fit (from 32 to 128 per GPU for some
models) and pay for the recomputation; on others it only costs. So it is a searched knob (`activation_checkpointing`),
applied only where the framework the result is exported to has the same switch, so that what is measured is what
the user's recipe runs:

- CAM++: 3D-Speaker's `memory_efficient` (DTDNN.CAMPPlus's default, True: the recipe checkpoints each dense layer's
  BN-ReLU-1x1 bottleneck; models/campplus.py);
- the conformer: WeNet's `gradient_checkpointing` (encoder_conf and decoder_conf: every encoder and decoder layer
  checkpointed with torch.utils.checkpoint, use_reentrant=False; models/conformer.py, models/transformer_decoder.py).

ERes2Net, ECAPA-TDNN and FastSpeech 2 are left out: neither 3D-Speaker, SpeechBrain nor ming024 has a switch for
them, so a measured gain could not be exported, and where the blocks hold BatchNorm the recomputation would update
its running statistics a second time per step, a change of the trained model the user's recipe would not make.

The knob's unset value (None) is the recipe's own: checkpointed for CAM++, not for the conformer. Checkpointing
never changes the gradients: the recomputed forward replays the same operations with the RNG state saved at the
first (preserve_rng_state, torch's default), so dropout draws the same masks (tests/knobs/test_checkpointing.py). It
does change BatchNorm running statistics inside a checkpointed segment (updated again in the recomputation), exactly as
in 3D-Speaker's and WeNet's own code.

The search trades it for a batch: a seed that runs out of the device's memory without checkpointing is tried next
with it at the same batch, before its batch is halved (search/seeds.py backed_off). The headroom gate and the worst-case
scan measure the checkpointed model as built, so their peaks are the checkpointed ones.
"""

from __future__ import annotations

__all__ = ["KNOB", "enabled"]

KNOB = "activation_checkpointing"


def enabled(value: bool | None, recipe: bool) -> bool:
    """Whether a trial checkpoints: the knob's value, or the recipe's own where it is unset."""
    return recipe if value is None else value
