"""Parents for the lifeline tests: `python -m tests.faults.parents WHAT CORPUS WORKDIR`.

- `amp-check`: runs the AMP check of a workload whose training hangs (the check's child never ends by itself);
- `orphan`: starts a trial child and exits at once, before the child can have set its lifeline; prints its pid.
Both use the faulty workload's batch 3, which hangs in its first step: a child that outlives its parent trains on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autotune import yamlio
from autotune.knobs.config import TrialConfig
from autotune.trial import TimingSettings, TrialSpec
from autotune.trial.amp_check import AmpCheckSpec, run_amp_check
from autotune.trial.amp_curves import AmpCheckSettings
from autotune.trial.launch import child_environment
from autotune.trial.lifeline import child_command
from tests.fixtures.faulty_workload import workload

HANGS = 3  # faulty_workload's batch size whose first training step never returns


def _spec(corpus: str, workdir: Path) -> TrialSpec:
    data_file = yamlio.write_json(workdir / "data.json", workload().load_data(corpus).to_dict())
    return TrialSpec(
        workload="tests.fixtures.faulty_workload:workload",
        workload_options={},
        data_file=str(data_file),
        config=TrialConfig(per_device_batch_size=HANGS),
        timing=TimingSettings(window_s=0.3, warmup_steps=1),
        device_type="cpu",
        result_path=str(workdir / "result.json"),
    )


def main(what: str, corpus: str, folder: str) -> None:
    workdir = Path(folder)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = _spec(corpus, workdir)
    if what == "amp-check":
        settings = AmpCheckSettings(batch_size=HANGS, steps=4, batches=1, smoothing_steps=1)
        run_amp_check(AmpCheckSpec(trial=spec, precisions=("bf16",), settings=settings), workdir / "amp")
        return
    spec_path = yamlio.write_json(workdir / "spec.json", spec.to_dict())
    import subprocess

    child = subprocess.Popen(child_command("autotune.trial", str(spec_path)), env=child_environment(spec))
    print(child.pid, flush=True)
    os._exit(0)  # gone before the child has started its interpreter, let alone set PR_SET_PDEATHSIG


if __name__ == "__main__":
    main(*sys.argv[1:])
