"""One process and model setup for everything that trains in a run's children: device, workload, data, model.

A trial (trial/child.py), the compute-only ceiling (a trial too) and the AMP check's curves (trial/amp_curves.py)
set up their process and build their model here: the device (the rank's GPU, made current), intra-op threads and
the precision's backend flags, the workload built from its data with a seed, the model on the device in train mode.
The threads and flags are set by knobs/process.py, which a user's load_config(...).apply_backend_flags() runs too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from autotune.data import DataSource
    from autotune.knobs.config import TrialConfig
    from autotune.knobs.precision import PrecisionSettings
    from autotune.trial.distributed import RankInfo
    from autotune.trial.spec import TrialSpec
    from autotune.workloads.base import TrainingSetup, Workload

__all__ = ["TrialProcess"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialProcess:
    """A child's device and the trial's workload with its data, read once; `build` makes a fresh model from them."""

    device: torch.device
    workload: Workload
    data: DataSource
    options: dict[str, Any]
    seed: int

    @classmethod
    def open(cls, spec: TrialSpec, rank: RankInfo | None = None) -> TrialProcess:
        """This rank's device (its local GPU made current, or the CPU), the spec's workload, options and data."""
        import torch

        from autotune import workloads, yamlio
        from autotune.data import DataSource

        local_rank = rank.local_rank if rank is not None else 0
        device = torch.device("cuda", local_rank) if spec.device_type == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        workload = workloads.get(spec.workload)
        return cls(
            device=device,
            workload=workload,
            data=DataSource.from_dict(yamlio.read_json(spec.data_file)),
            options={**workload.options, **spec.workload_options},
            seed=spec.seed,
        )

    def precision(self, config: TrialConfig, **overrides: Any) -> PrecisionSettings:
        """The configuration's precision settings on this device (a field overridden: the AMP check's precisions)."""
        from autotune.knobs.precision import PrecisionSettings

        fields = {"precision": config.precision, "cudnn_benchmark": config.cudnn_benchmark, **overrides}
        return PrecisionSettings(device_type=self.device.type, **fields)

    def build(self, config: TrialConfig) -> TrainingSetup:
        """The workload's model, optimiser, data and loss for this configuration, from the seed (the same seed gives
        the same initial weights), the model on the device in train mode."""
        import torch

        from autotune.workloads.base import WorkloadContext

        torch.manual_seed(self.seed)
        context = WorkloadContext(data=self.data, config=config, options=self.options, device=self.device)
        setup = self.workload.build(context)
        setup.model.to(self.device).train()
        return setup
