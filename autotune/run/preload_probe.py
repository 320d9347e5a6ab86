"""The preload probe: when the best configuration waits for data and the decoded corpus fits a RAM budget, the search's
last trial measures it with the audio decoded into RAM once (data/preload.py); the result says what that gained.

Decoding and reading files per item is the data pipeline's main cost for short speech clips; one of the reference
cases was bound by slow remote storage. Preloading is no search dimension (most configurations would not profit, and
every dimension costs trials): it is tried once, on the configuration it can help, and reported with the numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotune.result.diagnosis import DiagnosisSettings, decoded_audio_bytes
from autotune.workloads.registry import is_plugin

if TYPE_CHECKING:
    from autotune.search.candidates import TrialRecord
    from autotune.search.settings import TuningOutcome

__all__ = ["preload_probe", "preload_report"]


def preload_probe(
    *,
    model: str,
    data: dict[str, Any],
    world_size: int,
    memory_bytes: int,
    settings: DiagnosisSettings = DiagnosisSettings(),  # noqa: B008 - frozen
) -> Callable[[TrialRecord], bool] | None:
    """Whether a measured configuration is worth a trial with its audio preloaded; None when the corpus cannot be.

    The whole corpus must fit the RAM budget (that is what training would preload) once per rank (every training
    process holds its own copy), and the workload must be one of autotune's own (a plugin's dataset may not read
    TrialConfig.preload_audio, and the trial would measure nothing).

    Args:
        model: the run's --model; data: its data (DataSource.describe()); world_size: ranks per trial;
        memory_bytes: the machine's RAM.
    """
    if is_plugin(model):
        return None
    decoded = decoded_audio_bytes(data)
    if decoded is None or decoded * world_size > settings.preload_memory_fraction * memory_bytes:
        return None

    def worth_it(record: TrialRecord) -> bool:
        wait = record.result.data_wait_fraction
        return wait is not None and wait > settings.max_data_wait_fraction

    return worth_it


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def preload_report(outcome: TuningOutcome) -> tuple[dict[str, Any] | None, str | None]:
    """What the preload probe measured (None when it did not run), and a note for the result."""
    preloaded = [record for record in outcome.records if record.config.preload_audio]
    if not preloaded:
        return None, None
    config = preloaded[0].config
    plain = type(config).from_dict({**config.to_dict(), "preload_audio": False})
    without = [record.value for record in outcome.records if record.config == plain and record.result.feasible]
    with_preload = [record.value for record in preloaded if record.result.feasible]
    rate, rate_without = _median(with_preload), _median(without)
    report = {
        "configuration": config.short(),
        "samples_per_second": round(rate, 3) if rate else None,
        "without_preload_samples_per_second": round(rate_without, 3) if rate_without else None,
        "gain_fraction": round(rate / rate_without - 1.0, 4) if rate and rate_without else None,
        "preload_s": _median([record.result.preload_s for record in preloaded]),
        "status": preloaded[0].result.status,
    }
    if not with_preload:
        return report, f"preloading the decoded audio was tried and failed: {preloaded[0].result.reason}"
    gain = f"{report['gain_fraction']:+.0%}" if report["gain_fraction"] is not None else "an unknown change"
    chosen = outcome.winner is not None and outcome.winner.config.preload_audio
    verdict = "the winner preloads it" if chosen else "the winner reads audio per item"
    return report, (
        f"preloading the decoded audio into RAM (data-bound, the corpus fits) measured {gain} over reading per item "
        f"({config.short()}, {report['preload_s'] or 0:.0f} s to load); {verdict}"
    )
