#!/bin/bash
# A lent GPU's one prepared script. A lend is 15 minutes of device time, its start-up included, and one command may run
# 10 of them, so the order is what matters most first: the product (the full `autotune run` and its YAML read back in a
# plain loop), then the conformer's window noise that the search-quality figures wait on, then the CUDA paths already
# proved, in what time is left. Every part writes under $OUT as it goes: a part cut short keeps what it measured.
#
# On the lent machine, from the repository root, with the wheels benchmarks/gpu_proof.md lists in .whl/:
#     bash benchmarks/gpu_lend.sh            # the device tool: run(command=..., carry=[".whl"], timeout_s=560)
# Rehearsed on a CPU (the same parts, their plumbing only; nothing about CUDA):
#     REHEARSE=1 OUT=/tmp/lend-rehearsal LIMIT=900 bash benchmarks/gpu_lend.sh
set -u
T0=$(date +%s)
OUT=${OUT:?set OUT to a folder for the reports}
LIMIT=${LIMIT:-540}  # seconds for the whole script: the run's timeout less a margin for the copy back
REHEARSE=${REHEARSE:-0}
mkdir -p "$OUT"
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

if [ "$REHEARSE" = 1 ]; then
  PY=${PY:-.venv/bin/python}; DEVICE=cpu; PROOF_FLAGS=--rehearse-on-cpu
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "the wheels in .whl/ did not install: see benchmarks/gpu_proof.md" >&2; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD
  PY=python3; DEVICE=cuda; PROOF_FLAGS=
fi
export PYTHONUNBUFFERED=1
{ date; nvidia-smi 2>&1 | head -15
  $PY -c "import torch, torchaudio, optuna; print(torch.__version__, torch.version.cuda, torchaudio.__version__, optuna.__version__)"
  nproc; free -g; } > "$OUT/env.log" 2>&1

# 1. The product: the full run on cam++, then its YAML through load_config in a plain loop.
$PY benchmarks/gpu_proof.py $PROOF_FLAGS --steps full_run load_config_loop --time-limit $(( $(left) * 65 / 100 )) \
  --workdir /tmp/lend-kit --out "$OUT/proof-run.md" 2>&1 | tee "$OUT/console.log"

# 2. The conformer's window noise: per trial or within the window, which the simulated search figures assume.
if [ "$(left)" -ge 120 ]; then
  timeout $(( $(left) - 60 )) $PY benchmarks/window_noise.py --device $DEVICE --workload conformer --windows 5 20 \
    --reps 3 --shuffle-each --out "$OUT/window_noise-conformer.md" 2>&1 | tee -a "$OUT/console.log"
fi

# 3. The CUDA paths already proved, again on this machine's torch, in what is left.
if [ "$(left)" -ge 70 ]; then
  $PY benchmarks/gpu_proof.py $PROOF_FLAGS --steps tf32 telemetry peak_memory --time-limit $(( $(left) - 10 )) \
    --workdir /tmp/lend-kit2 --out "$OUT/proof-paths.md" 2>&1 | tee -a "$OUT/console.log"
fi
tar czf "$OUT/kit.tgz" --exclude='*.wav' --exclude='*.flac' --exclude='*.pt' -C /tmp lend-kit lend-kit2 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s of $LIMIT" | tee -a "$OUT/console.log"
