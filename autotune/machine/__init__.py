"""The machine a run measures on, read from the parent without initialising CUDA: its hardware and fingerprint
(hardware.py), the GPUs as NVML and CUDA_VISIBLE_DEVICES show them (gpus.py), GPU telemetry during a window
(telemetry.py), and how much of the CPU other processes take (cpu_load.py)."""
