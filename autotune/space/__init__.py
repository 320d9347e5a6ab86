"""Search spaces: Optuna's vocabulary in YAML, conditions as data, fitted to what this machine can run.

`load` reads a space file (its `extends` resolved: files.py), builds each knob's distribution and checks every value
it gives (params.py, conditions.py), and fits the recipe's baseline, the seeds and the global batch to the machine
(fit.py); knob_checks.py checks a space against what a workload's pipeline can run.
"""

from __future__ import annotations

from autotune.space.files import read
from autotune.space.params import CORE_PARAMS, MINIMUM, RECIPE_SETTINGS, Param
from autotune.space.search_space import SearchSpace, from_dict, load, space_path

__all__ = [
    "CORE_PARAMS",
    "MINIMUM",
    "RECIPE_SETTINGS",
    "Param",
    "SearchSpace",
    "from_dict",
    "load",
    "read",
    "space_path",
]
