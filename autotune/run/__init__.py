"""One `autotune run`, in the parent: the request checked and planned before anything is created (plan.py,
validation.py, output.py), the machine and the precisions checked first (preflight.py, assessment.py), the search
run, what it found concluded into a result (conclusion.py, preload_probe.py) and compared with the previous one
(drift.py), all driven by runner.py."""
