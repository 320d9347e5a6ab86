"""The erratic gate's threshold, measured: per-step CV against throughput CV (window quarters) of real trials.

Runs a small grid of CPU configurations of one workload on the default synthetic corpus, each a real 10 s trial in its
own subprocess, and prints one JSON line per trial (throughput, per-step CV, throughput CV, data wait, status).
The figures for the 0.3 default in benchmarks/README.md came from this on the 2-core development machine:

    .venv/bin/python benchmarks/erratic_threshold.py cam++ /tmp/cv/campp
"""

import itertools
import json
import sys
from pathlib import Path

from autotune import yamlio
from autotune.data import default_source
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec, launch

data = default_source()
out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
data_file = str(yamlio.write_json(out / "data.json", data.to_dict()))
workload = sys.argv[1]
batches = {"cam++": [8, 16, 32], "conformer": [4, 8, 16], "ecapa-tdnn": [16, 32], "fastspeech2": [4, 8]}[workload]
rows = []
for n, (bs, workers, precision, threads) in enumerate(itertools.product(batches, [0, 1, 2], ["fp32", "bf16"], [1, 2])):
    if workers >= 2 and threads == 2:
        continue
    config = TrialConfig(
        per_device_batch_size=bs,
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        persistent_workers=bool(workers),
        precision=precision,
        intra_op_threads=threads,
    )
    spec = TrialSpec(
        workload=workload,
        workload_options={},
        data_file=data_file,
        config=config,
        timing=TimingSettings(),
        device_type="cpu",
        result_path=str(out / f"t{n}" / "result.json"),
    )
    r = launch(spec, workdir=out / f"t{n}", timeout_s=300)
    row = dict(
        config=config.short(),
        status=r.status,
        sps=r.samples_per_second,
        steps=r.window_steps,
        step_cv=r.step_time_cv,
        thr_cv=r.throughput_cv,
        wait=r.data_wait_fraction,
    )
    print(json.dumps(row), flush=True)
    rows.append(row)
yamlio.write_json(out / "rows.json", rows)
