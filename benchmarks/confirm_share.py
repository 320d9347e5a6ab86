"""How much of a long run's budget confirmation should take: simulate.py's searches at several shares, with and
without the shipped space's seeds.

A long run (confirmation.is_long) keeps LONG_CONFIRM_SHARE of its budget for sequential halving over its leaders; the
rest is the search's. On the conformer landscape at 5% of the grid's time, the share decides between two losses: a
top configuration never measured (the search's), and one measured but not crowned (confirmation's, the window noise).
With the seeds, the first `cuda:` seed already is the landscape's best, so the search's loss cannot show and every
point of budget moved to confirmation looks like a gain. Without them (simulate.py --no-seeds) the search has to find
the best itself, and the same move shows its price. Judge a share on both.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/confirm_share.py --shares 0.45 0.7 0.8 --searches 100
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder of scripts, not a package

from autotune.search import (
    confirmation,
    tuner,  # noqa: E402, F401  (tuner: imports every module that reads the share)
)
from benchmarks import simulate  # noqa: E402
from benchmarks.tables import markdown_table, publish  # noqa: E402

Job = tuple[str, float, float, bool, int]


@contextlib.contextmanager
def confirm_share(share: float) -> Iterator[None]:
    """LONG_CONFIRM_SHARE set to share in every autotune module that holds the name (search/confirmation.py defines it;
    search/room.py imports it): found, not listed, so that moving the code that reads it cannot leave this benchmark
    patching a module that no longer does, and measuring the shipped share under another label."""
    readers = [
        module
        for name, module in sorted(sys.modules.items())
        if name.split(".")[0] == "autotune" and hasattr(module, "LONG_CONFIRM_SHARE")
    ]
    with contextlib.ExitStack() as stack:
        for module in readers:
            stack.enter_context(mock.patch.object(module, "LONG_CONFIRM_SHARE", share))
        yield


def _judge(job: Job) -> tuple[Job, simulate.Searched]:
    name, fraction, share, seeds, seed = job
    with confirm_share(share):
        return job, simulate.judge(name, "autotune", fraction, seed, simulate.Variant(seeds=seeds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscapes", nargs="+", default=["conformer 1xRTX4090 short clips"])
    parser.add_argument("--budget-fractions", type=float, nargs="+", default=[0.05])
    parser.add_argument("--shares", type=float, nargs="+", default=[confirmation.LONG_CONFIRM_SHARE, 0.7, 0.8])
    parser.add_argument("--searches", type=int, default=100, help="seeds 0..N-1 for each row")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    simulate._quiet()
    started = time.monotonic()
    for name in args.landscapes:  # fill the caches before the workers fork
        simulate.best_rate(name), simulate.grid_s(name)
    jobs = [
        (name, fraction, share, seeds, seed)
        for name in args.landscapes
        for fraction in args.budget_fractions
        for seeds in (True, False)
        for share in args.shares
        for seed in range(args.searches)
    ]
    with multiprocessing.get_context("fork").Pool(args.jobs, initializer=simulate._quiet) as pool:
        results = pool.map(_judge, jobs, chunksize=max(1, args.searches // 4))
    found: dict[tuple[str, float, bool, float], list[simulate.Searched]] = {}
    for (name, fraction, share, seeds, _), item in results:
        found.setdefault((name, fraction, seeds, share), []).append(item)
    rows = [
        {
            "landscape": name,
            "budget": f"{fraction:.0%}",
            "seeds": "shipped" if seeds else "none",
            "confirmation share": f"{share:.0%}",
            **simulate.summarise(items),
        }
        for (name, fraction, seeds, share), items in found.items()
    ]
    lines = [*markdown_table(rows), "", f"{len(jobs)} searches in {time.monotonic() - started:.0f} s."]
    raw = {" | ".join(map(str, key)): [item.regret for item in items] for key, items in found.items()}
    publish(lines, args.out, raw)


if __name__ == "__main__":
    main()
