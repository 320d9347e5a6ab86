"""3D-Speaker's trainer, speakerlab/bin/train.py (PyPI speakerlab 0.0.6), on the CPU: for the tests and the
benchmark that run it on a machine without a GPU; never part of what autotune hands a user.

train.py trains on CUDA only. The port replaces the calls that need CUDA, and the decoder this environment lacks,
and nothing else: the dataset, the DataLoader, CAM++, the one-rank DistributedDataParallel, SGD, the schedulers, the
logging and the checkpoints are speakerlab's own code, run as train.py runs them.

- torch.cuda.set_device(gpu): does nothing (train.py picks the --gpu entry of its LOCAL_RANK);
- torch.distributed.init_process_group(backend='nccl'): the gloo backend instead (nccl needs CUDA);
- Tensor.cuda(...) and Module.cuda(...): return the tensor or the module itself, so the batch and the model stay on
  the CPU;
- torchaudio.load(path): decoded by soundfile (float32, channels first, as torchaudio returns it), as autotune's own
  pipeline decodes: torchaudio 2.9 and later read through torchcodec, which this environment does not install.
  speakerlab's reader and its noise and reverb corrupter look torchaudio.load up at each call, so the DataLoader's
  workers (forked after the patch) decode this way too.

Speed perturbation (the recipes' speed_pertub: True) needs torchaudio.sox_effects, gone from torchaudio 2.9: a
command run through the port passes --speed_pertub False.

Run as a script, it applies the patches and calls speakerlab.bin.train.main() with its own arguments. Copied to
`<folder>/speakerlab/bin/train.py`, a command running it is accepted by `--recipe 3d-speaker` as one running
speakerlab's own train.py.
"""

from __future__ import annotations

from typing import Any


def cpu_patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each call the port replaces: set them with setattr, or with pytest's
    monkeypatch.setattr to have them undone."""
    import soundfile
    import torch
    import torch.distributed as dist
    import torchaudio

    init_process_group = dist.init_process_group

    def gloo(backend: str | None = None, **kwargs: Any) -> None:
        init_process_group(backend="gloo", **kwargs)

    def load(path: str) -> tuple[torch.Tensor, int]:
        samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
        return torch.from_numpy(samples.T.copy()), rate

    def stay(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    return [
        (torch.cuda, "set_device", lambda device: None),
        (dist, "init_process_group", gloo),
        (torch.Tensor, "cuda", stay),
        (torch.nn.Module, "cuda", stay),
        (torchaudio, "load", load),
    ]


def main() -> None:
    for owner, name, value in cpu_patches():
        setattr(owner, name, value)
    from speakerlab.bin import train

    train.main()


if __name__ == "__main__":
    main()
