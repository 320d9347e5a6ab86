"""The AAM-softmax loss in each recipe's convention: 3D-Speaker's (recorded from its code) and SpeechBrain's (run)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autotune import workloads
from autotune.models.margin import ArcMarginLoss
from tests.models.reference_models import load_reference
from tests.workloads.speaker_setup import build


@pytest.mark.parametrize("margin", [0.2, 0.3])
def test_3d_speaker_convention_is_3d_speakers_loss(margin: float) -> None:
    recorded = load_reference("3d_speaker_augment_and_margin")["margin_loss"]
    case = next(case for case in recorded["cases"] if case["margin"] == margin)
    cosine, labels = torch.tensor(recorded["cosine"]), torch.tensor(recorded["labels"])
    assert cosine[1, 2] < math.cos(math.pi - margin)  # the fallback decides this row
    loss = ArcMarginLoss(scale=case["scale"], margin=margin, convention="3d-speaker")(cosine, labels)
    assert float(loss) == pytest.approx(case["loss"], rel=1e-6)
    speechbrain = ArcMarginLoss(scale=case["scale"], margin=margin, convention="speechbrain")(cosine, labels)
    assert float(speechbrain) != pytest.approx(case["loss"], rel=1e-3)  # the fallback is what tells them apart


def test_3d_speaker_fallback_is_continuous() -> None:
    margin = 0.2
    loss = ArcMarginLoss(margin=margin, convention="3d-speaker")
    assert loss.threshold - loss.fallback == pytest.approx(-1.0)  # = cos((pi - m) + m), the margin branch's end


def test_speechbrain_convention_is_speechbrains_loss() -> None:
    losses = pytest.importorskip("speechbrain.nnet.losses")
    generator = torch.Generator().manual_seed(1)
    cosine = torch.rand(6, 9, generator=generator) * 2 - 1
    cosine[0, 4], cosine[2, 1] = -0.995, 1.0  # past the threshold; and at the clamp
    labels = torch.tensor([4, 0, 1, 8, 3, 2])
    theirs = losses.LogSoftmaxWrapper(losses.AdditiveAngularMargin(margin=0.2, scale=30))(
        cosine.unsqueeze(1), labels.unsqueeze(1)
    )
    ours = ArcMarginLoss(scale=30.0, margin=0.2, convention="speechbrain")(cosine, labels)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_unknown_convention_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown margin convention"):
        ArcMarginLoss(convention="insightface")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "convention", "margin", "scale"),
    [
        ("cam++", "3d-speaker", 0.2, 32.0),
        ("eres2net", "3d-speaker", 0.3, 32.0),
        ("eres2net-large", "3d-speaker", 0.3, 32.0),
        ("ecapa-tdnn", "speechbrain", 0.2, 30.0),
        ("ecapa-tdnn-512", "speechbrain", 0.2, 30.0),
    ],
)
def test_each_workload_uses_its_recipes_loss(
    name: str, convention: str, margin: float, scale: float, tiny_corpus: Path
) -> None:
    setup = build(name, tiny_corpus, crop_s=0.5)
    loss = setup.model["loss"]
    assert (loss.convention, loss.scale) == (convention, scale)
    assert loss.cos_m == pytest.approx(math.cos(margin))
    assert workloads.get(name).options["margin"] == margin
