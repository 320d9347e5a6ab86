"""What a run hands over and what reads it: the TunedConfig written as YAML and read back by load_config
(tuned_config.py), a configuration's measurements summarised (measurements.py), what bounds the winner
(diagnosis.py), every accepted result kept (history.py), and the report with its plots (report.py, plots.py)."""

from __future__ import annotations

from autotune.result.measurements import Measurements
from autotune.result.tuned_config import TunedConfig, load_config

__all__ = ["Measurements", "TunedConfig", "load_config"]
