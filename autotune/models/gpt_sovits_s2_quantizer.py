"""GPT-SoVITS s2's residual vector quantizer: one frozen codebook, set by k-means on the first forward.

Follows RVC-Boss/GPT-SoVITS at commit 48b1a0169a28582a8984402f82cf438d3bfa6aca: ``GPT_SoVITS/module/quantize.py`` and
``core_vq.py``. Attribute names are the reference's so its state dicts load with ``strict=True``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FrozenResidualQuantizer", "kmeans"]


def kmeans(samples: torch.Tensor, clusters: int, iterations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """core_vq's k-means: initial means drawn from ``samples`` with torch's RNG, Lloyd iterations on cdist; a
    cluster left empty keeps its mean. Returns the means and the last assignment's counts.

    Draws as the reference does: ``randperm`` of the rows if there are more than 10,000 (keeping 10,000), then
    ``randperm`` (enough rows) or ``randint`` (fewer rows than clusters) for the initial means.
    """
    if samples.shape[0] > 10_000:
        samples = samples[torch.randperm(samples.shape[0], device=samples.device)[:10_000]]
    rows = samples.shape[0]
    if rows >= clusters:
        means = samples[torch.randperm(rows, device=samples.device)[:clusters]]
    else:
        means = samples[torch.randint(0, rows, (clusters,), device=samples.device)]
    counts = torch.zeros(clusters, dtype=torch.long, device=samples.device)
    for _ in range(iterations):
        assignment = torch.cat([torch.cdist(chunk, means).argmin(dim=1) for chunk in samples.split(64)])
        counts = torch.bincount(assignment, minlength=clusters)
        sums = torch.zeros_like(means).index_add_(0, assignment, samples)
        empty = counts == 0
        means = torch.where(empty[:, None], means, sums / counts.clamp(min=1)[:, None].to(samples.dtype))
    return means, counts


class _Codebook(nn.Module):
    """EuclideanCodebook's buffers: ``inited``, ``cluster_size``, ``embed`` and ``embed_avg``."""

    inited: torch.Tensor
    cluster_size: torch.Tensor
    embed: torch.Tensor
    embed_avg: torch.Tensor

    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.register_buffer("inited", torch.zeros(1))
        self.register_buffer("cluster_size", torch.zeros(size))
        self.register_buffer("embed", torch.zeros(size, dim))
        self.register_buffer("embed_avg", torch.zeros(size, dim))


class _VectorQuantization(nn.Module):
    _codebook: _Codebook

    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.project_in = nn.Identity()
        self.project_out = nn.Identity()
        self._codebook = _Codebook(dim, size)


class _ResidualVectorQuantization(nn.Module):
    def __init__(self, dim: int, size: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VectorQuantization(dim, size) for _ in range(layers))


class FrozenResidualQuantizer(nn.Module):
    """The RVQ (one codebook) as s2 training runs it with ``freeze_quantizer``: always in eval mode, so no EMA
    update, no straight-through gradient and a commitment loss of 0. An uninitialised codebook (``inited`` 0, as a
    fresh model has) is set by `kmeans` on the first batch: a one-off cost that draws from torch's RNG."""

    def __init__(self, dim: int, size: int, kmeans_iters: int) -> None:
        super().__init__()
        self.kmeans_iters = kmeans_iters
        self.vq = _ResidualVectorQuantization(dim, size, 1)

    @property
    def codebook(self) -> _Codebook:
        """The one codebook's buffers (``vq.layers.0._codebook``)."""
        layer = self.vq.layers[0]
        assert isinstance(layer, _VectorQuantization)
        return layer._codebook

    @torch.no_grad()
    def initialise(self, rows: torch.Tensor) -> None:
        """Run the k-means initialisation on (N, dim) rows unless the codebook is already set."""
        codebook = self.codebook
        if bool(codebook.inited):
            return
        means, counts = kmeans(rows.detach(), codebook.embed.shape[0], self.kmeans_iters)
        codebook.embed.copy_(means)
        codebook.embed_avg.copy_(means)
        codebook.cluster_size.copy_(counts)
        codebook.inited.fill_(1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, dim, T) features -> their nearest codes (B, dim, T), the code ids (1, B, T), the commitment loss."""
        rows = x.transpose(1, 2).reshape(-1, x.shape[1])
        self.initialise(rows)
        embed = self.codebook.embed
        distance = -(rows.pow(2).sum(1, keepdim=True) - 2 * rows @ embed.t() + embed.pow(2).sum(1)[None])
        ids = distance.max(dim=-1).indices
        quantized = F.embedding(ids, embed).view(x.shape[0], x.shape[2], -1).transpose(1, 2)
        return quantized, ids.view(1, x.shape[0], x.shape[2]), x.new_zeros(())
