#!/usr/bin/env bash
# Accelerator check for a lent GPU machine (no Ray there: the in-process backend runs the same
# worker code). Writes everything under ${OUT:-./device-out}. Usage: bash ci/device_check.sh
set -uo pipefail
out=${OUT:-./device-out}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{
  echo "== doctor"; $py -m rlctl.cli.main doctor --json > "$out/doctor.json"; echo "rc=$?"
  echo "== engines on cuda"; $py -m pytest -q tests/engines -k "not distributed" 2>&1 | tail -5
  echo "== tiny GRPO on cuda (in-process)"
  $py -m rlctl.cli.main --log-format plain train profiles/tiny-cpu.toml \
    --set 'platform.vendor="nvidia"' --set 'cluster.backend="inprocess"' --set 'platform.dtype="float32"' \
    --output-dir "$out/runs" --max-steps 200 2>&1 | tail -20
  echo "== bench rollout"; $py -m rlctl.cli.main bench rollout --json > "$out/bench_rollout.json"; echo "rc=$?"
} 2>&1 | tee "$out/device_check.log"
