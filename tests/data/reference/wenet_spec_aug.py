"""Records what WeNet's own spec_aug does to feature matrices, for tests/data/test_asr_features.py.

Run against a checkout of wenet-e2e/wenet (no wenet code is kept here; the JSON it writes names file and commit):

    PYTHONPATH=. python tests/data/reference/wenet_spec_aug.py /path/to/wenet COMMIT tests/data/reference/X.json

wenet/dataset/processor.py imports langid at module level for its language-id step (not spec_aug's concern, and not
installed here): a stand-in module answers that import, and the package `wenet` is entered without its __init__ (which
loads the CLI and every model). Everything spec_aug runs is WeNet's own code and Python's
`random`, seeded once.
"""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path

import torch

BINS = 80
LENGTHS = (30, 120, 300)  # shorter than one time mask (50), a few masks, a typical 3 s utterance
DRAWS = 20000
SEED = 0


def mask_statistics(masked: torch.Tensor, lengths: torch.Tensor) -> dict[str, list[float]]:
    """Statistics of SpecAugment's output on all-ones features, read the same way from any implementation.

    Args:
        masked: (N, frames, bins) SpecAugment of ones, each row valid up to its length (all rows one length here).
        lengths: (N,) valid frames per row.

    Returns:
        frame_masked (frames): share of rows whose frame t is all zero; bin_masked (bins): share whose bin f is zero
        over all valid frames; zero_frames / zero_bins: histograms (0..frames, 0..bins) of how many per row.
    """
    frames, bins = int(lengths.max()), masked.shape[2]
    masked = masked[:, :frames]
    valid = torch.arange(frames).unsqueeze(0) < lengths.unsqueeze(1)
    zero = masked == 0
    frame_zero = zero.all(dim=2) & valid
    bin_zero = (zero | ~valid.unsqueeze(2)).all(dim=1)
    rows = masked.shape[0]
    return {
        "frame_masked": (frame_zero.double().sum(0) / rows).tolist(),
        "bin_masked": (bin_zero.double().sum(0) / rows).tolist(),
        "zero_frames": (torch.bincount(frame_zero.sum(1), minlength=frames + 1).double() / rows).tolist(),
        "zero_bins": (torch.bincount(bin_zero.sum(1), minlength=bins + 1).double() / rows).tolist(),
    }


def _import_processor(checkout: Path) -> types.ModuleType:
    stand_in = types.ModuleType("langid.langid")
    stand_in.model = None  # type: ignore[attr-defined]
    stand_in.LanguageIdentifier = type(  # type: ignore[attr-defined]
        "LanguageIdentifier", (), {"from_modelstring": staticmethod(lambda *args, **kwargs: None)}
    )
    sys.modules.setdefault("langid", types.ModuleType("langid"))
    sys.modules["langid.langid"] = stand_in
    package = types.ModuleType("wenet")  # wenet/__init__.py loads its CLI and models: only the dataset package here
    package.__path__ = [str(checkout / "wenet")]  # type: ignore[attr-defined]
    sys.modules["wenet"] = package
    from wenet.dataset import processor

    return processor


def record(checkout: Path, commit: str) -> dict:
    processor = _import_processor(checkout)
    random.seed(SEED)
    by_length = {}
    for frames in LENGTHS:
        outputs = [processor.spec_aug({"feat": torch.ones(frames, BINS)})["feat"] for _ in range(DRAWS)]
        by_length[str(frames)] = mask_statistics(torch.stack(outputs), torch.full((DRAWS,), frames))
    return {
        "repository": "wenet-e2e/wenet",
        "commit": commit,
        "file": "wenet/dataset/processor.py",
        "function": "spec_aug(sample, num_t_mask=2, num_f_mask=2, max_t=50, max_f=10) (its defaults: aishell's)",
        "how": f"spec_aug of {{'feat': torch.ones(frames, {BINS})}} {DRAWS} times per length after "
        f"random.seed({SEED}), "
        "read by tests/data/reference/wenet_spec_aug.py mask_statistics; langid stood in for at import",
        "draws": DRAWS,
        "bins": BINS,
        "lengths": by_length,
    }


if __name__ == "__main__":
    checkout, commit, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    out.write_text(json.dumps(record(checkout, commit)) + "\n")
