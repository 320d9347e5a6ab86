"""Speaker-classification datasets doing a recipe's per-item work in DataLoader workers: decode, crop, resample,
fbank; and for 3D-Speaker's recipes also speed perturbation and noise/reverb corruption (`SpeakerlabDataset`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
import torchaudio.functional as AF

from autotune.data.audio import AudioReader, read_segment
from autotune.data.corruption import SPEEDS, Corruption, crop_or_pad, speed_perturb
from autotune.data.features import FbankConfig, compute_fbank
from autotune.data.sources import Utterance

__all__ = ["SpeakerCropDataset", "SpeakerlabDataset", "collate_speaker_batch"]


class SpeakerCropDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Random fixed-length crops of utterances as fbank features, labelled with the speaker's index.

    The work happens in ``__getitem__`` (so in DataLoader workers), which is what makes data loading a real cost
    for the tuner to measure: only the crop window is decoded, converted to mono float32, resampled when the file's
    rate differs from the fbank rate, zero-padded at the end when the utterance is shorter than the crop, and turned
    into mean-normalised fbank. Crop positions come from torch's RNG, which DataLoader seeds per worker.
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        speakers: Sequence[str],
        *,
        crop_s: float = 3.0,
        fbank: FbankConfig = FbankConfig(),  # noqa: B008 - frozen, so a shared default is safe
        audio: AudioReader | None = None,
        featurise: bool = True,
    ) -> None:
        """Index the utterances.

        Args:
            utterances: the items, e.g. ``DataSource.utterances``.
            speakers: speaker names; an item's label is its speaker's index here (``DataSource.speakers``).
            crop_s: length of every crop in seconds.
            fbank: feature settings; ``fbank.sample_rate`` is the rate crops are resampled to.
            audio: what decodes an utterance: None = `read_segment` (from disk, per item); a `PreloadedAudio` of
                these utterances reads the same crops from RAM.
            featurise: False: an item is the crop's waveform, and the training step computes its fbank on the device
                (`autotune.data.features.batched_fbank`; the feature_device knob).
        """
        self.utterances = tuple(utterances)
        self.speakers = tuple(speakers)
        label_of = {name: index for index, name in enumerate(self.speakers)}
        unknown = sorted({u.speaker for u in self.utterances} - label_of.keys())
        if unknown:
            raise ValueError(f"speakers {unknown[:5]} of the utterances are not in the speakers list")
        self.labels = tuple(label_of[u.speaker] for u in self.utterances)
        self.crop_s = crop_s
        self.fbank = fbank
        self.audio: AudioReader = read_segment if audio is None else audio
        self.featurise = featurise
        self.crop_samples = round(crop_s * fbank.sample_rate)
        self.num_frames = fbank.num_frames(self.crop_samples)
        if self.num_frames == 0:
            raise ValueError(f"crop_s={crop_s} is shorter than one fbank frame")

    @property
    def num_classes(self) -> int:
        """Classes the classifier needs: one per speaker."""
        return len(self.speakers)

    def __len__(self) -> int:
        """Number of utterances."""
        return len(self.utterances)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """One random crop.

        Args:
            index: utterance index.

        Returns:
            (fbank of shape (num_frames, num_mel_bins), float32; speaker label).
        """
        return self._features(self._read_crop(self.utterances[index])), self.labels[index]

    def _features(self, waveform: torch.Tensor) -> torch.Tensor:
        """The item's fbank, or its waveform when the training step computes the fbank (featurise False)."""
        return compute_fbank(waveform, self.fbank) if self.featurise else waveform

    def _read_crop(self, utt: Utterance) -> torch.Tensor:
        """Decode a random crop_s window of the utterance's segment at fbank rate, zero-padded to crop_samples."""
        waveform, rate = self.audio(utt, crop_s=self.crop_s)
        if rate != self.fbank.sample_rate:
            waveform = AF.resample(waveform, rate, self.fbank.sample_rate)
        waveform = waveform[: self.crop_samples]
        return F.pad(waveform, (0, self.crop_samples - waveform.numel()))


class SpeakerlabDataset(SpeakerCropDataset):
    """3D-Speaker's WavSVDataset item: decode, speed-perturb, crop, corrupt, fbank (`autotune.data.corruption`).

    As speakerlab's WavReader, the whole segment is decoded and perturbed before the crop is taken (the cost grows
    with the utterance, not with the crop). With ``speed_perturb`` the label of an item played at SPEEDS[i] is
    ``speaker + i * n_speakers``, so `num_classes` is three times the speakers (train.py: 5,994 VoxCeleb2 speakers
    become 17,982 classes).
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        speakers: Sequence[str],
        *,
        crop_s: float = 3.0,
        speed_perturb: bool = True,
        corruption: Corruption | None = None,
        fbank: FbankConfig = FbankConfig(),  # noqa: B008 - frozen, so a shared default is safe
        audio: AudioReader | None = None,
        featurise: bool = True,
    ) -> None:
        """Index the utterances; ``corruption`` None (or aug_prob 0) leaves crops clean. Other arguments as
        `SpeakerCropDataset`."""
        super().__init__(utterances, speakers, crop_s=crop_s, fbank=fbank, audio=audio, featurise=featurise)
        self.speed_perturb = speed_perturb
        self.corruption = corruption

    @property
    def num_classes(self) -> int:
        """Classes the classifier needs: speakers x 3 under speed perturbation."""
        return len(self.speakers) * (len(SPEEDS) if self.speed_perturb else 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """(fbank (num_frames, num_mel_bins) of a perturbed, cropped, maybe corrupted crop, or the crop itself when
        not featurising; class label)."""
        utt = self.utterances[index]
        waveform, rate = self.audio(utt, crop_s=None)
        if rate != self.fbank.sample_rate:
            waveform = AF.resample(waveform, rate, self.fbank.sample_rate)
        speed_index = int(torch.randint(len(SPEEDS), (1,))) if self.speed_perturb else 0
        waveform = crop_or_pad(speed_perturb(waveform, SPEEDS[speed_index], self.fbank.sample_rate), self.crop_samples)
        if self.corruption is not None:
            waveform = self.corruption(waveform)
        return self._features(waveform), self.labels[index] + speed_index * len(self.speakers)


def collate_speaker_batch(items: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack dataset items into a batch.

    Args:
        items: (fbank, label) pairs of equal fbank shape (or (waveform, label) pairs of equal length).

    Returns:
        (feats of shape (B, frames, num_mel_bins) (or waveforms (B, samples)), labels of shape (B,) int64).
    """
    feats = torch.stack([feat for feat, _ in items])
    labels = torch.tensor([label for _, label in items], dtype=torch.int64)
    return feats, labels
