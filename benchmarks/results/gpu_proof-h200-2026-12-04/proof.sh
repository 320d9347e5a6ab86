#!/bin/bash
# The lent H200's one prepared script: the product first (the full run and its YAML in a plain loop), then the OOM
# study never yet proven, then the cheap CUDA paths in what time is left.
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date; nvidia-smi; python3 -c "import torch, torchaudio, optuna; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torchaudio.__version__, optuna.__version__)"; nproc; free -g; } > $OUT/env.log 2>&1
python3 benchmarks/gpu_proof.py --steps full_run load_config_loop oom_study --time-limit 470 --workdir /tmp/kit --out $OUT/proof-run.md 2>&1 | tee $OUT/console.log
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "left for the CUDA paths: $LEFT s" | tee -a $OUT/console.log
if [ $LEFT -ge 70 ]; then
  python3 benchmarks/gpu_proof.py --steps tf32 telemetry peak_memory nccl cudnn_benchmark --time-limit $((LEFT - 10)) --workdir /tmp/kit2 --out $OUT/proof-paths.md 2>&1 | tee -a $OUT/console.log
fi
tar czf $OUT/kit.tgz --exclude='*.wav' --exclude='*.flac' --exclude='*.pt' -C /tmp kit kit2 2>/dev/null
ls -la $OUT; echo "total $(( $(date +%s) - T0 )) s"
