"""CAM++ as a user's plain training script builds it: the model, the recipe's optimiser and loss head, from autotune's
public modules and the workload's recipe options (never a copy of the numbers)."""

from __future__ import annotations

from typing import Any

__all__ = ["LossModule", "build_campplus", "campplus_loss", "random_fbank_batch"]


def build_campplus(device: Any, num_speakers: int, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(model, optimizer): CAM++ with its cosine classifier and AAM-softmax loss, SGD with Nesterov as 3D-Speaker."""
    import torch
    from torch import nn

    from autotune import workloads
    from autotune.models.campplus import CAMPPlus
    from autotune.models.margin import ArcMarginLoss, CosineClassifier

    options = {**workloads.get("cam++").options, **(options or {})}
    model = nn.ModuleDict(
        {
            "embedder": CAMPPlus(embedding_size=options["embedding_size"]),
            "classifier": CosineClassifier(options["embedding_size"], num_speakers),
            "loss": ArcMarginLoss(scale=options["scale"], margin=options["margin"]),
        }
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=options["lr"], momentum=0.9, nesterov=True, weight_decay=1e-4)
    return model, optimizer


def campplus_loss(model: Any, features: Any, labels: Any) -> Any:
    return model["loss"](model["classifier"](model["embedder"](features)), labels)


def random_fbank_batch(device: Any, batch_size: int, num_speakers: int, frames: int = 298, seed: int = 0) -> Any:
    """Normalised fbank-shaped input (3 s crops, 80 bins) and speaker labels: real gradients without data loading."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(batch_size, frames, 80, generator=generator)
    labels = torch.randint(num_speakers, (batch_size,), generator=generator)
    return features.to(device), labels.to(device)


def _module_base() -> type:
    from torch import nn

    return nn.Module


class LossModule(_module_base()):  # type: ignore[misc]
    """CAM++ with its head as one module whose forward is the loss: what DistributedDataParallel wraps."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: Any, labels: Any) -> Any:
        return campplus_loss(self.model, features, labels)
