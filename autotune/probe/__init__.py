"""Your own training as a trial: the probe that measures it from inside, and the launcher that runs your command.

The probe enters the training process the way coverage or a profiler does, through a `sitecustomize` on the
command's PYTHONPATH (bootstrap/), so the user's code is not changed. Inside, it follows torch's optimizer steps, the
batches each DataLoader yields and how long each step waited for them, the loss given to backward, and the settings
in force during the step; it times one steady window by the trials' rules (trial/steady.py), writes the trial's
result and ends the training at a step boundary. Parent side: command.py fills the command's placeholders, writes the
tuned copy of the user's config file, runs it under the probe as a trial and says which tuned values were in force.
docs/own-training.md says what it can and cannot see.
"""

from __future__ import annotations

from autotune.probe.settings import PROBE_ENV, ProbeSettings, bootstrap_dir

__all__ = ["PROBE_ENV", "ProbeSettings", "bootstrap_dir"]
