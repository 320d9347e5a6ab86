"""Dynamic against bucket batches on this machine: a real autotune run (grid, trials in subprocesses) of the conformer
at a reduced size on a synthetic corpus of 0.5-6 s utterances: dynamic batches of one frame budget, then bucket
batches with the same budget for the longest bucket at bucket_scaling 1.0, 1.5 and 2.0. Prints each trial's
configuration, status, samples/s and the buckets it formed, as JSON lines.

    PYTHONPATH=. python benchmarks/bucket_batches.py OUT_FOLDER [--window-s 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.data import generate_corpus
from autotune.run import runner
from autotune.run.plan import RunRequest
from autotune.search.settings import TunerSettings
from autotune.trial import TimingSettings

SPACE = """\
params:
  batch_type: {type: categorical, choices: [dynamic, bucket]}
  bucket_scaling: {type: categorical, choices: [1.0, 1.5, 2.0], when: {batch_type: bucket}}
fixed: {max_frames_in_batch: 3000, num_buckets: 4, per_device_batch_size: 4, num_workers: 0, precision: fp32,
        intra_op_threads: 2}
baseline: {batch_type: dynamic}
"""
MODEL = {"output_size": 128, "attention_heads": 4, "linear_units": 512, "num_blocks": 4, "decoder_blocks": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--window-s", type=float, default=8.0)
    args = parser.parse_args()
    corpus = generate_corpus(
        args.out / "corpus", n_speakers=4, files_per_speaker=15, min_duration_s=0.5, max_duration_s=6.0, seed=7
    )
    space = args.out / "space.yaml"
    space.write_text(SPACE)
    request = RunRequest(
        model="conformer",
        data=str(corpus),
        space=str(space),
        results_dir=str(args.out / "results"),
        device="cpu",
        workload_options={"model": MODEL},
        settings=TunerSettings(
            trials=12, sampler="grid", confirm_top_k=0, timing=TimingSettings(window_s=args.window_s)
        ),
        warm_start=False,
        compute_ceiling=False,
        amp_check=None,
    )
    run = runner.execute(runner.prepare(request))
    for record in run.outcome.records:
        accounting = record.result.epoch_accounting or {}
        print(
            json.dumps(
                {
                    "role": record.role,
                    "config": record.config.short(),
                    "status": record.result.status,
                    "samples_per_second": record.result.samples_per_second,
                    "batches_per_epoch": accounting.get("batches_per_epoch_per_rank"),
                    "buckets": accounting.get("buckets"),
                }
            )
        )


if __name__ == "__main__":
    main()
