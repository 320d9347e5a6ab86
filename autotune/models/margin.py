"""Additive angular margin (AAM) softmax over a cosine classifier, as 3D-Speaker's ArcMarginLoss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CosineClassifier", "ArcMarginLoss"]


class CosineClassifier(nn.Module):
    """Cosine similarity between L2-normalised embeddings and L2-normalised class centres."""

    def __init__(self, embedding_size: int, num_classes: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(embeddings), F.normalize(self.weight))


class ArcMarginLoss(nn.Module):
    """Cross-entropy over scale * cos(theta + margin) for the target class (the non-easy-margin variant).

    Args:
        scale: logit scale s (the recipe uses 32).
        margin: angular margin m in radians (the recipe ramps it to 0.2).
    """

    def __init__(self, scale: float = 32.0, margin: float = 0.2) -> None:
        super().__init__()
        self.scale = scale
        self.cos_m, self.sin_m = math.cos(margin), math.sin(margin)
        # Past theta = pi - m, cos(theta + m) stops decreasing; this linear stand-in keeps the logit monotonic.
        self.threshold = math.cos(math.pi - margin)
        self.fallback = math.sin(math.pi - margin) * margin

    def forward(self, cosine: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = cosine.float()  # the margin arithmetic is unstable in half precision
        sine = torch.sqrt((1.0 - cosine.pow(2)).clamp(0.0, 1.0))
        with_margin = cosine * self.cos_m - sine * self.sin_m
        with_margin = torch.where(cosine > self.threshold, with_margin, cosine - self.fallback)
        one_hot = F.one_hot(labels, cosine.shape[1]).to(cosine.dtype)
        logits = self.scale * (one_hot * with_margin + (1.0 - one_hot) * cosine)
        return F.cross_entropy(logits, labels)
