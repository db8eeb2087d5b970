#!/usr/bin/env bash
# Measure the article's model on this machine's GPU: KV bytes per token, decode step time against batch size
# (1..256) and context (1k..32k tokens), prefill time against prompt length. Writes one CSV:
#   $OUT/calibration/<gpu>.csv when OUT is set (the device tool's output folder), else data/calibration/<gpu>.csv.
# Commit that file to data/calibration/ and re-run notebooks/05_calibration.ipynb.
#
# Needs: a CUDA GPU, Python with torch (>= 2.3), numpy and pandas. It installs nothing when torch imports;
# otherwise it tries `pip install torch` once (offline machines: put wheels in $TORCH_WHEELS and it installs
# from there with --no-index). The grid stops itself after KVLAB_TIME_LIMIT_S seconds (default 300), so the
# whole run stays under 6 minutes on an H200; points skipped for time or memory are listed in the CSV header.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && .venv/bin/python -c "import torch" 2>/dev/null && PY=.venv/bin/python

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "torch is not importable by $PY; installing it" >&2
  if [ -n "${TORCH_WHEELS:-}" ]; then
    "$PY" -m pip install --quiet --no-index --find-links "$TORCH_WHEELS" torch
  else
    timeout 240 "$PY" -m pip install --quiet torch || { echo "could not install torch (offline?): set TORCH_WHEELS to a folder of wheels" >&2; exit 3; }
  fi
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch ' + torch.__version__ + ' sees no CUDA GPU')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

dest="${OUT:+$OUT/calibration}"
dest="${dest:-data/calibration}"
mkdir -p "$dest"
name="$("$PY" -c "import torch, re; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name(0).lower()).strip('-'))")"
time "$PY" -m kvlab calibrate --device cuda --dtype bfloat16 --time-limit-s "${KVLAB_TIME_LIMIT_S:-300}" \
  --out "$dest/$name.csv" "$@"
echo "wrote $dest/$name.csv"
