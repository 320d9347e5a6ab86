"""The example training as a Lightning user writes it, with a bucket sampler that shards by rank itself, as
GPT-SoVITS's s1 (DistributedBucketSampler) does: under Trainer(use_distributed_sampler=True), Lightning shards that
sampler's output again, and each of N ranks trains on 1/N^2 of the data per epoch. autotune's probe reports it
(README: "Tune your own training"); --use-distributed-sampler false is the fix.

`make` is the same training as a factory for `autotune run --lightning train_lightning:make`: it takes the DataLoader
knobs it builds with, and Lightning's Trainer is autotune's to build (docs/own-training.md).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import lightning
import torch
import yaml
from train import Crops, model_for


class RankBucketSampler(torch.utils.data.Sampler[int]):
    """This rank's share of the items, ordered in buckets of similar index (a stand-in for length buckets)."""

    def __init__(self, size: int, bucket: int = 8) -> None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if distributed else 0
        self.replicas = torch.distributed.get_world_size() if distributed else 1
        self.size, self.bucket, self.epoch = size, bucket, 0

    def __len__(self) -> int:
        return math.ceil(self.size / self.replicas)

    def __iter__(self):  # noqa: ANN204 - a generator of indices
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        buckets = [sorted(order[i : i + self.bucket]) for i in range(0, self.size, self.bucket)]
        flat = [index for bucket in buckets for index in bucket]
        flat += flat[: len(self) * self.replicas - len(flat)]
        return iter(flat[self.rank :: self.replicas])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class Classifier(lightning.LightningModule):
    def __init__(self, config: dict, batch_size: int, workers: int, persistent: bool | None = None) -> None:
        super().__init__()
        self.config, self.batch_size, self.workers = config, batch_size, workers
        self.persistent = workers > 0 if persistent is None else persistent
        self.dataset = Crops(config["data"]["root"], config["data"]["crop_s"])
        self.model = model_for(len(self.dataset.speakers), config["model"]["channels"])

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=RankBucketSampler(len(self.dataset)),
            num_workers=self.workers,
            persistent_workers=self.persistent and self.workers > 0,
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        features, labels = batch
        return torch.nn.functional.cross_entropy(self.model(features.transpose(1, 2)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.config["train"]["lr"])


def make(
    per_device_batch_size: int = 16, num_workers: int = 0, persistent_workers: bool = False, config: str = "train.yaml"
) -> Classifier:
    """The module, its loader built with the knobs given (`autotune run --lightning train_lightning:make`)."""
    settings = yaml.safe_load(Path(config).read_text())
    return Classifier(settings, per_device_batch_size, num_workers, persistent_workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--use-distributed-sampler", default="true")
    parser.add_argument("--precision", default="32-true")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    module = Classifier(config, config["train"]["batch_size"], args.num_workers)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        precision=args.precision,
        max_epochs=config["train"]["epochs"],
        use_distributed_sampler=args.use_distributed_sampler == "true",
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(module)


if __name__ == "__main__":
    main()
