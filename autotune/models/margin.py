"""Additive angular margin (AAM) softmax over a cosine classifier, as 3D-Speaker and SpeechBrain write it.

Both compute cross-entropy over ``scale * cos(theta + m)`` for the target class and ``scale * cos(theta)`` for the
others (SpeechBrain's LogSoftmaxWrapper is KL divergence to one-hot targets over the batch: the same number). They
differ where ``cos(theta + m)`` stops decreasing (theta > pi - m, i.e. cos(theta) < cos(pi - m)), where each falls
back to a straight line:

- 3D-Speaker ``speakerlab/loss/margin_loss.py`` ArcMarginLoss: ``cos - (1 + cos(pi - m))``, continuous at the
  threshold (both sides give -1);
- SpeechBrain ``speechbrain/nnet/losses.py`` AdditiveAngularMargin: ``cos - sin(pi - m) * m`` (the CosFace-style
  fallback of InsightFace), with the cosines first clamped to +-(1 - 1e-7).

Each workload uses its recipe's formula (tests/models/test_margin.py checks both against their sources).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CosineClassifier", "ArcMarginLoss", "MarginConvention"]

MarginConvention = Literal["3d-speaker", "speechbrain"]
_SPEECHBRAIN_CLAMP = 1e-7


class CosineClassifier(nn.Module):
    """Cosine similarity between L2-normalised embeddings and L2-normalised class centres.

    One ``weight`` of shape (num_classes, embedding_size), the key both 3D-Speaker's CosineClassifier and
    SpeechBrain's ECAPA Classifier (with no extra linear blocks, as their recipes build it) use.
    """

    def __init__(self, embedding_size: int, num_classes: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(embeddings), F.normalize(self.weight))


class ArcMarginLoss(nn.Module):
    """Cross-entropy over scale * cos(theta + margin) for the target class (the non-easy-margin variant).

    Args:
        scale: logit scale s (3D-Speaker's recipes 32, SpeechBrain's 30).
        margin: angular margin m in radians (the recipes' final margin: CAM++ 0.2, ERes2Net 0.3, ECAPA 0.2).
        convention: whose fallback past theta = pi - m: "3d-speaker" or "speechbrain" (see the module docstring).
    """

    def __init__(self, scale: float = 32.0, margin: float = 0.2, convention: MarginConvention = "3d-speaker") -> None:
        super().__init__()
        if convention not in ("3d-speaker", "speechbrain"):
            raise ValueError(f"unknown margin convention {convention!r}; use '3d-speaker' or 'speechbrain'")
        self.scale = scale
        self.convention = convention
        self.cos_m, self.sin_m = math.cos(margin), math.sin(margin)
        # Past theta = pi - m, cos(theta + m) stops decreasing; a linear stand-in keeps the logit monotonic.
        self.threshold = math.cos(math.pi - margin)
        if convention == "3d-speaker":
            self.fallback = 1.0 + math.cos(math.pi - margin)
        else:
            self.fallback = math.sin(math.pi - margin) * margin

    def forward(self, cosine: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = cosine.float()  # the margin arithmetic is unstable in half precision
        if self.convention == "speechbrain":
            cosine = cosine.clamp(-1 + _SPEECHBRAIN_CLAMP, 1 - _SPEECHBRAIN_CLAMP)
        # 3D-Speaker takes sqrt(1 - cos^2) unclamped (NaN if rounding pushes |cos| past 1); clamping changes nothing
        # where the reference is finite.
        sine = torch.sqrt((1.0 - cosine.pow(2)).clamp(0.0, 1.0))
        with_margin = cosine * self.cos_m - sine * self.sin_m
        with_margin = torch.where(cosine > self.threshold, with_margin, cosine - self.fallback)
        one_hot = F.one_hot(labels, cosine.shape[1]).to(cosine.dtype)
        logits = self.scale * (one_hot * with_margin + (1.0 - one_hot) * cosine)
        return F.cross_entropy(logits, labels)
