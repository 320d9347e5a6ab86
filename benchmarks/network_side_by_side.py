"""The built-in speaker networks beside the reference implementations' own modules: one training step's forward and
backward on the same batch of fbank, fp32 and bf16 autocast, interleaved, the order rotated each round.

recipe_side_by_side.py compares whole trainings (pipeline, loop and bookkeeping included); this isolates the network
code, where a difference of cost hides most easily: two modules with the same parameters, the same outputs and a
different count of copies (a pad, a transpose, a contiguous()) cost different times. The references are run from
their own packages: SpeechBrain's speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN (PyPI speechbrain) at the VoxCeleb
recipe's network (channels [1024, 1024, 1024, 1024, 3072], attention 128, embedding 192), and speakerlab's CAMPPlus
(embedding 512, memory_efficient as the recipe) and ERes2Net (m_channels 32, embedding 192) from PyPI speakerlab, each
in training mode. A ratio is the median step of the reference over the built-in's, above 1 where the built-in is
cheaper.

    .venv/bin/python benchmarks/network_side_by_side.py --rounds 8
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "bf16")


def _ecapa() -> tuple[nn.Module, nn.Module]:
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    from autotune.models.ecapa_tdnn import ECAPATDNN

    reference = ECAPA_TDNN(80, channels=[1024, 1024, 1024, 1024, 3072], attention_channels=128, lin_neurons=192)
    return reference, ECAPATDNN(channels=1024, embedding_size=192)


def _campplus() -> tuple[nn.Module, nn.Module]:
    from speakerlab.models.campplus.DTDNN import CAMPPlus as Reference

    from autotune.models.campplus import CAMPPlus

    return Reference(feat_dim=80, embedding_size=512, memory_efficient=True), CAMPPlus(embedding_size=512)


def _eres2net() -> tuple[nn.Module, nn.Module]:
    from speakerlab.models.eres2net.ERes2Net import ERes2Net as Reference

    from autotune.models.eres2net import ERes2Net

    return Reference(feat_dim=80, embedding_size=192, m_channels=32), ERes2Net(m_channels=32, embedding_size=192)


NETWORKS: dict[str, tuple[str, Callable[[], tuple[nn.Module, nn.Module]]]] = {
    "ecapa-tdnn": ("SpeechBrain ECAPA_TDNN", _ecapa),
    "cam++": ("speakerlab CAMPPlus", _campplus),
    "eres2net": ("speakerlab ERes2Net", _eres2net),
}


def _step(model: nn.Module, features: torch.Tensor, precision: str) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = model(features)
    out.float().square().mean().backward()
    return time.perf_counter() - start


def measure(name: str, rounds: int, batch: int, crop_s: float) -> dict[str, object]:
    torch.manual_seed(0)
    reference, ours = NETWORKS[name][1]()
    reference.train()
    ours.train()
    features = torch.randn(batch, int(crop_s * 100) + 1, 80)
    sides = {"reference": reference, "built-in": ours}
    for model in sides.values():  # one untimed step each: allocator and kernel selection
        for precision in PRECISIONS:
            _step(model, features, precision)
    times: dict[tuple[str, str], list[float]] = {(side, p): [] for side in sides for p in PRECISIONS}
    for index in range(rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for precision in PRECISIONS:
            for side in order:
                times[(side, precision)].append(_step(sides[side], features, precision))
    return {
        "parameters": (sum(p.numel() for p in reference.parameters()), sum(p.numel() for p in ours.parameters())),
        "medians": {key: statistics.median(values) for key, values in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+", choices=sorted(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--crop-s", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    rows = []
    for name in args.networks:
        found = measure(name, args.rounds, args.batch, args.crop_s)
        medians = found["medians"]
        assert isinstance(medians, dict)
        reference_count, ours_count = found["parameters"]  # type: ignore[misc]
        for precision in PRECISIONS:
            theirs, mine = medians[("reference", precision)], medians[("built-in", precision)]
            rows.append(
                f"| {name} | {NETWORKS[name][0]} | {reference_count:,} / {ours_count:,} | {precision} | "
                f"{theirs:.3f} | {mine:.3f} | {theirs / mine:.2f} |"
            )
            print(rows[-1], flush=True)
    minutes = (time.time() - started) / 60
    lines = [
        f"# The built-in speaker networks beside the references' own modules ({date.today()}, {platform.node()}, CPU)",
        "",
        f"`.venv/bin/python benchmarks/network_side_by_side.py --rounds {args.rounds}` ({minutes:.0f} min; "
        f"batch {args.batch} of {args.crop_s:g}-second fbank, {args.threads} threads, torch {torch.__version__}; "
        "forward and backward, median of the rounds, interleaved)",
        "",
        "| network | reference | parameters (reference / built-in) | precision | reference step s | built-in step s "
        "| reference / built-in |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    out = args.out or ROOT / "benchmarks" / "results" / f"network-side-by-side-{date.today()}.md"
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
