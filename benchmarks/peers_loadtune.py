"""loadtune's side of the peer comparison: a loadtune workload file, and a driver that tunes it with loadtune's API.

Runs in the peers' own virtualenv (peers.py makes it), never in autotune's. The workload is autotune's recipe
pipeline wrapped in loadtune's interface (make_dataset / make_model / make_optimizer / train_step): loadtune builds
the DataLoader itself, so it sees the same dataset, model, optimizer and loss as every other tool. Its `tune()`
has no wall-clock budget, so the driver sizes its steps per trial to the budget (loadtune's own 10:1 ratio of
measured to warm-up steps) from the recipe's step time, and records the wall time it really took.

    PEERS_MODEL=cam++ PEERS_DATA_FILE=data.json PEERS_BATCH=64 \
        benchmarks/.peers-venv/bin/python benchmarks/peers_loadtune.py --steps 20 --out rec.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

_built: dict[str, Any] = {}  # make_dataset builds the whole setup; make_model and make_optimizer hand out its parts


def _make_dataset() -> Any:
    import peers_train

    _built["setup"] = peers_train.build(
        os.environ["PEERS_MODEL"],
        os.environ["PEERS_DATA_FILE"],
        json.loads(os.environ.get("PEERS_OPTIONS", "{}")),
        peers_train.from_plain({"batch_size": int(os.environ["PEERS_BATCH"])}).config,
    )
    return _built["setup"].dataset


def _make_model() -> Any:
    return _built["setup"].model


def _make_optimizer(model: Any) -> Any:
    return _built["setup"].optimizer  # the recipe's optimizer, over the very parameters a compiled wrapper shares


def _train_step(model: Any, optimizer: Any, batch: Any, device: Any) -> Any:
    setup = _built["setup"]
    loss = setup.loss_fn(model, setup.batch_to_device(batch, device, False))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def get_workload() -> Any:
    """loadtune's entry point for a workload file."""
    from loadtune import Workload

    setup_collate = None
    if "setup" not in _built:
        _make_dataset()
    setup_collate = _built["setup"].collate_fn
    return Workload(
        name=os.environ["PEERS_MODEL"],
        make_dataset=_make_dataset,
        make_model=_make_model,
        train_step=_train_step,
        make_optimizer=_make_optimizer,
        default_batch_size=int(os.environ["PEERS_BATCH"]),
        collate_fn=setup_collate,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True, help="measured steps per trial")
    parser.add_argument("--out", type=Path, required=True, help="the recommendation, as JSON")
    args = parser.parse_args()
    from loadtune import tune
    from loadtune.workload import load_workload

    started = time.monotonic()
    workload = load_workload(__file__)  # as loadtune's README loads a workload file
    result = tune(workload, steps=args.steps, warmup=max(1, args.steps // 10))
    best = result.best.knobs if result.best and result.speedup > 1.0 else None
    knobs = best.to_dict() if best else result.baseline.knobs
    args.out.write_text(
        json.dumps(
            {
                "tuning_s": time.monotonic() - started,
                "knobs": knobs,
                "label": best.label() if best else "baseline kept: " + json.dumps(result.baseline.knobs),
                "own_speedup": result.speedup,
                "diagnosis": result.diagnosis,
            }
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
