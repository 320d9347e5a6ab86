"""Where a trial computes its input features: in the DataLoader workers, per item, or batch-wise in the training step
on the device (the `feature_device` knob).

Where the workers cannot keep up, moving the filterbank onto the device frees them for decoding and augmentation, at
the price of device time inside the step (WeNet PR 152 made that move; its figures:
benchmarks/README.md#where-the-features-are-computed). Which wins depends on the machine, so it is searched where a
pipeline can do both.

A workload says which placements its pipeline can run (`Workload.feature_devices`); the knob unset (None) is the
recipe's own placement, so every space and result that does not name it stays what it was. The 3D-Speaker pipelines
(CAM++, ERes2Net) and the WeNet conformer run both:

- their recipe featurises in the workers (speakerlab WavSVDataset.__getitem__ calls its FBank); moved to the device,
  the workers deliver the crop they already cut, speed-perturbed and corrupted, and the step computes the same
  Kaldi fbank of the batch (`autotune.data.features.batched_fbank`, frame for frame compute_fbank's);
- SpeechBrain's ECAPA recipe already computes Fbank in compute_forward on the device, after the augmentation that
  needs the batch there: there is nothing to move, and workers cannot do what comes after a batch-level augmenter;
- the WeNet conformer featurises in the workers (fbank with dither, then SpecAugment); moved to the device, the
  workers still decode, resample and speed-perturb, and the step computes the batched fbank of the padded waveforms
  and SpecAugment with each utterance's masks drawn within its own length, as WeNet's spec_aug draws them
  (`autotune.data.asr_features`; the batches by frames are unchanged: the samplers read durations, not items);
- FastSpeech2 trains on mel spectrograms ming024's preprocess.py extracted once before training (prepare_data):
  no features are computed during training, so there is nothing to place.
"""

from __future__ import annotations

__all__ = ["DEVICE", "KNOB", "PLACEMENTS", "WORKERS"]

WORKERS = "workers"
DEVICE = "device"
PLACEMENTS = (WORKERS, DEVICE)
KNOB = "feature_device"
