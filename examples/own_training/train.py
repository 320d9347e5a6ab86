"""A plain PyTorch training script, as a user writes one: its own argparse, config file, dataset, DataLoader, model and
loop. autotune knows nothing of it; `autotune run --command` tunes it from outside (README: "Tune your own training").

It trains a small speaker classifier on 80-bin log-mel filterbanks of 2-second crops of the WAV files under --data
(a folder of speaker subfolders, as autotune's embedded corpus is), decoded with soundfile in the DataLoader's workers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import soundfile
import torch
import torchaudio
import yaml


class Crops(torch.utils.data.Dataset):
    """2-second crops of every WAV file under a folder, labelled by speaker folder; fbank computed per item."""

    def __init__(self, root: str, crop_s: float) -> None:
        self.files = sorted(Path(root).rglob("*.wav"))
        if not self.files:
            raise SystemExit(f"no .wav files under {root}")
        self.speakers = {name: index for index, name in enumerate(sorted({f.parent.name for f in self.files}))}
        self.crop_s = crop_s

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        info = soundfile.info(str(path))
        frames = int(self.crop_s * info.samplerate)
        start = (index * 7919) % max(1, info.frames - frames)
        audio, rate = soundfile.read(str(path), start=start, frames=frames, dtype="float32", always_2d=True)
        wave = torch.from_numpy(audio[:, 0]).unsqueeze(0)
        if wave.shape[1] < frames:
            wave = torch.nn.functional.pad(wave, (0, frames - wave.shape[1]))
        features = torchaudio.compliance.kaldi.fbank(wave * 32768, num_mel_bins=80, sample_frequency=rate)
        return features - features.mean(dim=0), self.speakers[path.parent.name]


def model_for(speakers: int, channels: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv1d(80, channels, 5, padding=2),
        torch.nn.ReLU(),
        torch.nn.BatchNorm1d(channels),
        torch.nn.Conv1d(channels, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.BatchNorm1d(channels),
        torch.nn.AdaptiveAvgPool1d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(channels, speakers),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="YAML: data, train (batch_size, epochs, lr), model")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--pin-memory", default="false")
    parser.add_argument("--ignore-workers", action="store_true", help="build the DataLoader with num_workers=0 anyway")
    parser.add_argument("--checkpoint", default=None, help="save the model here after every epoch")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    train = config["train"]
    dataset = Crops(config["data"]["root"], config["data"]["crop_s"])
    workers = 0 if args.ignore_workers else args.num_workers
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=train["batch_size"],
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=args.pin_memory == "true",
        prefetch_factor=args.prefetch_factor if workers > 0 else None,
        persistent_workers=workers > 0,
    )
    model = model_for(len(dataset.speakers), config["model"]["channels"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=train["lr"])
    for epoch in range(train["epochs"]):
        for features, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(features.transpose(1, 2)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        print(json.dumps({"epoch": epoch, "loss": float(loss)}), flush=True)
        if args.checkpoint:
            torch.save(model.state_dict(), args.checkpoint)


if __name__ == "__main__":
    main()
