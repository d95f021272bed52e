#!/usr/bin/env bash
# GPU acceptance check for one NVIDIA CUDA device: one run under 10 minutes, in-process backend
# (no Ray), HF rollout (no vLLM). Every section runs under its own `timeout`, all of them under one
# overall deadline; the end prints a PASS/FAIL table. Everything is written under ${OUT:-./device-out}.
#
#   bash ci/device_check.sh          # exit 0: all PASS; 1: something failed; 2: no CUDA device here
#
# Sections: doctor; the device's copy bandwidth; the engine tests on cuda; FSDP2 (one NCCL rank) with
# bf16 mixed precision feeding the HF rollout engine; GRPO on the built-in task in bf16 and in fp32,
# each of which must raise held-out accuracy; bench parity (numerics against a CPU float64 reference);
# bench rollout; bench reshard.
# shellcheck disable=SC2317  # the sec_* functions run indirectly, as `bash -o pipefail -c sec_NAME`
set -uo pipefail
OUT=$(realpath -m "${OUT:-./device-out}")
export OUT
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

export PY=${PYTHON:-python3}
# the sections' budget; the script ends within it plus the last section's kill grace (10 s) and the
# 30 s summary, so under 10 minutes in all
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-540}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RLCTL_TEST_DEVICES=cuda # tests/conftest.py: run only the cuda half of device-parametrised tests
export MIN_ACC_GAIN=${MIN_ACC_GAIN:-0.05}

if ! timeout 120 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "device_check: no CUDA device is visible to torch ($PY); this script needs one: exit 2" >&2
  exit 2
fi

mkdir -p "$OUT"
rm -rf "$OUT/runs" "$OUT/accuracy.tsv" # a rerun into the same folder starts clean

# -- sections: functions run as `timeout LIMIT bash -o pipefail -c sec_NAME`; exit 0 is PASS ------------

sec_gpu() {
  "$PY" - <<'EOF' || return 1
import importlib.util, sys
need = ["transformers", "safetensors", "click", "structlog", "rich", "tomli_w", "pytest", "hypothesis"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("  python", sys.version.split()[0], "| missing:", ", ".join(missing) or "nothing")
sys.exit(1 if missing else 0)
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" - <<'EOF' | tee "$OUT/gpu.json"
import json, torch
p = torch.cuda.get_device_properties(0)
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "name": p.name,
                  "capability": list(torch.cuda.get_device_capability(0)),
                  "memory_gib": round(p.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
                  "bf16": torch.cuda.is_bf16_supported()}))
EOF
}

sec_doctor() {
  # every section runs the in-process backend, so a host without Ray is fine here: doctor's
  # package:ray FAIL is printed but does not fail the section; any other FAIL does
  "$PY" -m rlctl.cli.main doctor --json --vendor nvidia >"$OUT/doctor.json"
  "$PY" - <<'EOF'
import json, os, sys
doc = json.load(open(os.path.join(os.environ["OUT"], "doctor.json")))
print("  platform", doc["platform"]["name"], "| summary", doc["summary"])
not_needed = {"package:ray"}
failed = []
for c in doc["checks"]:
    if c["verdict"] in ("WARN", "FAIL"):
        print(f"  {c['verdict']} {c['name']}: {c['reason']}" + (f" (fix: {c['fix']})" if c.get("fix") else ""))
    if c["verdict"] == "FAIL" and c["name"] not in not_needed:
        failed.append(c["name"])
print("  failing:", ", ".join(failed) or "nothing this check needs")
sys.exit(1 if failed else 0)
EOF
}

sec_bandwidth() {
  # payload bytes / s of the best of 10 copies of 1 GiB, the convention of `rlctl bench reshard`
  "$PY" - <<'EOF' | tee "$OUT/bandwidth.json"
import json, torch
n = 1 << 30
def best(dst, src, reps=10):
    dst.copy_(src); torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src, non_blocking=True); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return n / min(times) / 1e9
x = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
y = torch.empty_like(x)
host = torch.empty(n, dtype=torch.uint8).pin_memory()
print(json.dumps({"bytes": n, "d2d_copy_gbps": round(best(y, x), 1),
                  "h2d_pinned_gbps": round(best(x, host), 1), "d2h_pinned_gbps": round(best(host, x), 1)}))
EOF
}

sec_engine_tests() {
  "$PY" -m pytest -q -p no:cacheprovider -k cuda --junitxml="$OUT/engine_tests.xml" \
    tests/engines/test_hf_rollout.py tests/engines/test_sampling.py tests/engines/test_fsdp_train.py \
    tests/engines/test_bench_rollout.py 2>&1 | tail -25
}

sec_fsdp2_bf16() {
  "$PY" - <<'EOF'
"""One NCCL rank: FSDP2 (fully_shard) with bf16 compute over fp32 master weights, synced into the
HF rollout engine on the same device, which samples with a device generator and returns host tensors."""
import os, socket, sys, tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.getcwd())
from rlctl.engines.fsdp_train import FSDPTrainEngine
from rlctl.engines.hf_rollout import HFRolloutEngine
from rlctl.engines.optim import OptimConfig
from tests.engines.helpers import EOS, make_batch, make_model, token_mean_loss

with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
fails = []
def check(name, ok, detail=""):
    print(f"  {'PASS' if ok else 'FAIL'} {name} {detail}")
    if not ok: fails.append(name)

with tempfile.TemporaryDirectory() as tmp:
    path = make_model(Path(tmp) / "m", seed=3)
    batch = make_batch(8, prompt_len=6, resp_len=5, seed=1)
    tiny = FSDPTrainEngine(path, device="cuda", mixed_precision="bfloat16", optim=OptimConfig(lr=1e-6))
    local = {k: v.to_local() for k, v in tiny.export_weights("sharded")}
    check("fully_shard applied", tiny.distributed and all(hasattr(v, "device_mesh") for _, v in tiny.export_weights("sharded")))
    check("fp32 master weights", {v.dtype for v in local.values()} == {torch.float32})
    before = {k: v.clone() for k, v in local.items()}
    tiny.train_batch(batch, token_mean_loss)
    moved = sum(int(not torch.equal(before[k], v.to_local())) for k, v in tiny.export_weights("sharded"))
    check("lr 1e-6 moves the weights", moved > 0, f"({moved}/{len(before)} tensors changed)")

    engine = FSDPTrainEngine(path, device="cuda", mixed_precision="bfloat16", micro_batch_size=3,
                             optim=OptimConfig(lr=1e-3, weight_decay=0.0))
    lp0 = engine.compute_log_prob(batch)["log_probs"]
    check("log-probs come back on the host", lp0.device.type == "cpu")
    losses = [engine.train_batch(batch, token_mean_loss)["loss"] for _ in range(10)]
    check("loss falls", losses[-1] < losses[0], f"({losses[0]:.4f} -> {losses[-1]:.4f})")

    rollout = HFRolloutEngine(path, device="cuda", dtype="bfloat16")
    n = rollout.update_weights(engine.export_weights("full"))
    rollout.sleep(); rollout.wake()
    ids, mask = batch["input_ids"][:, :6], batch["attention_mask"][:, :6]
    a = rollout.generate(ids, mask, n=2, max_new_tokens=8, eos_token_id=EOS, seed=11)
    b = rollout.generate(ids.cuda(), mask.cuda(), n=2, max_new_tokens=8, eos_token_id=EOS, seed=11)
    c = rollout.generate(ids, mask, n=2, max_new_tokens=8, eos_token_id=EOS, seed=12)
    check("synced every parameter", n == len(list(engine.model.parameters())), f"({n})")
    check("rollout outputs on the host", all(v.device.type == "cpu" for v in a.values()))
    check("same seed, same samples", all(torch.equal(a[k], b[k]) for k in a))
    check("other seed, other samples", not torch.equal(a["responses"], c["responses"]))
    rec = engine.compute_log_prob(a)["log_probs"]
    m = a["response_mask"].bool()
    diff = float((rec[m] - a["rollout_log_probs"][m]).abs().max())
    check("bf16 rollout vs bf16 trainer log-prob gap is small", diff < 0.5, f"(max |diff| {diff:.4f})")
dist.destroy_process_group()
sys.exit(1 if fails else 0)
EOF
}

sec_bench_parity() {
  # `rlctl bench parity --device cuda`: the built-in tiny model's log-probs, entropy, loss, per-layer
  # grad norms, one AdamW step and the HF rollout engine's log-probs on the GPU's kernels, each against
  # a CPU float64 reference; PASS/WARN/FAIL per dtype (exit 1 on a FAIL). SmolLM2 joins when imported.
  "$PY" -m rlctl.cli.main bench parity --device cuda --dtypes float32,bfloat16,float16 --json \
    --out "$OUT/parity" >"$OUT/bench_parity.json"
  local rc=$?
  "$PY" - <<'EOF2'
import json, os
try:
    d = json.load(open(os.path.join(os.environ["OUT"], "bench_parity.json")))
except (OSError, ValueError) as e:
    raise SystemExit(f"  bench_parity.json unreadable ({e})")
for case in d["cases"]:
    env = case["environment"]
    print(f"  {case['case']['name']} on {env['device_name']} ({env.get('driver')}):")
    for r in case["results"]:
        q = r["quantities"]
        gap = q["train_vs_rollout_gap"]
        print(f"    {r['dtype']:9s} {r['verdict']:4s} train lp mean err {q['train_log_probs']['mean_abs']:.3g}, "
              f"rollout lp {q['rollout_log_probs'].get('mean_abs', float('nan')):.3g}, grad norms rel "
              f"{q['grad_norms']['mean_rel']:.3g}, step rel {q['optimizer_step']['rel_l1']:.3g}, gap mean "
              f"{gap.get('mean', float('nan')):.3g} p99 {gap.get('p99', float('nan')):.3g}"
              + (f"; FAIL: {', '.join(r['failing'])}" if r["failing"] else ""))
EOF2
  return "$rc"
}

train_run() { # train_run NAME DTYPE STEPS VAL_EVERY
  local name=$1 dtype=$2 steps=$3 every=$4
  "$PY" -m rlctl.cli.main --log-format plain train profiles/tiny-cpu.toml --resume never \
    --set 'platform.vendor="nvidia"' --set 'cluster.backend="inprocess"' --set 'rollout.engine="hf"' \
    --set "platform.dtype=\"$dtype\"" --set "run.name=\"$name\"" --set "trainer.val_every=$every" \
    --output-dir "$OUT/runs" --max-steps "$steps" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -4 "$OUT/$name.log"
  ((rc == 0)) || { echo "  train exited $rc (log: $OUT/$name.log)"; return 1; }
  if ! grep -q "platform=nvidia" "$OUT/$name.log" || ! grep -q "dtype=$dtype" "$OUT/$name.log"; then
    echo "  FAIL: the run did not start on platform=nvidia with dtype=$dtype"
    return 1
  fi
  "$PY" - "$OUT/runs/$name/metrics.jsonl" "$name" <<'EOF'
"""Held-out accuracy (val/accuracy in metrics.jsonl) must rise by MIN_ACC_GAIN; no metric non-finite."""
import json, math, os, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
vals = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
bad = sorted({k for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)})
gain = float(os.environ["MIN_ACC_GAIN"])
ok = len(vals) >= 2 and vals[-1][1] >= vals[0][1] + gain and not bad
trail = " ".join(f"{s}:{a:.3f}" for s, a in vals)
print(f"  {'PASS' if ok else 'FAIL'} {sys.argv[2]}: val/accuracy by step {trail} (needs +{gain})"
      + (f"; non-finite: {', '.join(bad)}" if bad else ""))
with open(os.path.join(os.environ["OUT"], "accuracy.tsv"), "a") as f:
    f.write(f"{sys.argv[2]}\t{vals[0][1] if vals else 'nan'}\t{vals[-1][1] if vals else 'nan'}\n")
sys.exit(0 if ok else 1)
EOF
}

sec_grpo_bf16() { train_run grpo-bf16 bfloat16 60 20; }
sec_grpo_fp32() { train_run grpo-fp32 float32 30 15; }

sec_bench_rollout() {
  local rc=0
  "$PY" -m rlctl.cli.main bench rollout --json --device cuda --dtype bfloat16 >"$OUT/bench_rollout.json" || rc=1
  "$PY" -m rlctl.cli.main bench rollout --json --device cuda --dtype bfloat16 --hidden-size 1024 \
    --layers 8 --vocab-size 32000 --batch 32 --new-tokens 64 --repeats 3 >"$OUT/bench_rollout_1024.json" || rc=1
  "$PY" - <<'EOF'
import json, os
for name in ("bench_rollout.json", "bench_rollout_1024.json"):
    try:
        d = json.load(open(os.path.join(os.environ["OUT"], name)))
    except (OSError, ValueError) as e:
        print(f"  {name}: unreadable ({e})"); continue
    c = d["config"]
    print(f"  {name}: hidden {c['hidden_size']} x{c['layers']} batch {c['batch']}: engine "
          f"{d['engine_tokens_per_s']:.0f} tok/s, generate {d['generate_tokens_per_s']:.0f} tok/s, ratio {d['ratio']:.2f}")
EOF
  return "$rc"
}

sec_bench_reshard() {
  # `rlctl bench reshard --device cuda`: the cases that fit one GPU (one rank, p = q = 1) in device
  # memory, each strategy against the device-to-device copy bandwidth measured in the same process
  "$PY" -m rlctl.cli.main bench reshard --device cuda --json --models tiny,qwen2-0.5b --pairs 1:1 \
    --repeat 2 >"$OUT/bench_reshard.json" || return 1
  "$PY" - <<'EOF'
import json, os, sys
rows = json.load(open(os.path.join(os.environ["OUT"], "bench_reshard.json")))
for r in rows:
    frac = f"{r['frac_memcpy']:.0%}" if r["frac_memcpy"] is not None else "-"
    print(f"  {r['model']} {r['p']}:{r['q']} {r['strategy']:8s} {r['gbps']:.2f} GB/s = {frac} of the "
          f"{r['device']} d2d copy {r['memcpy_gbps']:.1f} GB/s ({r['backend']}), peak extra "
          f"{r['peak_extra_mb']:.1f} MiB, match={r['match']}")
bad = [r for r in rows if not r["match"] or r["device"] != "cuda"]
sys.exit(1 if bad or not rows else 0)
EOF
}

export -f sec_gpu sec_doctor sec_bandwidth sec_engine_tests sec_fsdp2_bf16 sec_bench_parity train_run \
  sec_grpo_bf16 sec_grpo_fp32 sec_bench_rollout sec_bench_reshard

# -- runner --------------------------------------------------------------------------------------------
names=() results=() seconds=()
run_section() { # run_section NAME LIMIT_S: run sec_NAME under min(LIMIT_S, what is left of the budget)
  local name=$1 want=$2 left t rc t0
  left=$((BUDGET_S - SECONDS))
  t=$((want < left ? want : left))
  names+=("$name")
  if ((t < 15)); then
    echo "== $name: SKIP (no time left in the ${BUDGET_S}s budget)"
    results+=("SKIP") seconds+=(0)
    return
  fi
  echo "== $name (limit ${t}s)"
  t0=$SECONDS
  timeout --kill-after=10 "$t" bash -o pipefail -c "sec_$name"
  rc=$?
  seconds+=($((SECONDS - t0)))
  if ((rc == 0)); then
    results+=("PASS")
  elif ((rc == 124 || rc == 137)); then
    results+=("FAIL (timed out at ${t}s)")
  else
    results+=("FAIL (rc=$rc)")
  fi
  echo "-- $name: ${results[-1]} in ${seconds[-1]}s"
}

main() {
echo "device_check: $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(hostname), budget ${BUDGET_S}s, out $OUT"
run_section gpu 30
run_section doctor 60
run_section bandwidth 45
run_section engine_tests 150
run_section fsdp2_bf16 90
run_section bench_parity 90
run_section grpo_bf16 180
run_section grpo_fp32 110
run_section bench_rollout 60
run_section bench_reshard 90

echo
echo "== summary (${SECONDS}s)"
printf '%-14s %-26s %s\n' section result seconds
status=0
for i in "${!names[@]}"; do
  printf '%-14s %-26s %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
  [[ ${results[$i]} == PASS ]] || status=1
done
timeout 30 "$PY" - <<'EOF'
"""The numbers side by side: device copy bandwidth, rollout throughput, reshard rate, accuracy."""
import json, os
out = os.environ["OUT"]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
bw = load("bandwidth.json")
if bw:
    print(f"device copy 1 GiB: d2d {bw['d2d_copy_gbps']} GB/s, h2d pinned {bw['h2d_pinned_gbps']} GB/s, "
          f"d2h pinned {bw['d2h_pinned_gbps']} GB/s")
for name in ("bench_rollout.json", "bench_rollout_1024.json"):
    d = load(name)
    if d:
        c = d["config"]
        print(f"bench rollout h{c['hidden_size']}x{c['layers']} b{c['batch']}: engine {d['engine_tokens_per_s']:.0f} "
              f"tok/s, generate {d['generate_tokens_per_s']:.0f} tok/s, ratio {d['ratio']:.2f}")
rows = load("bench_reshard.json") or []
for model in dict.fromkeys(r["model"] for r in rows):
    best = max((r for r in rows if r["model"] == model and r["strategy"] == "planned"), key=lambda r: r["gbps"], default=None)
    if best:
        d2d = f", sec_bandwidth d2d {bw['d2d_copy_gbps']} GB/s" if bw else ""
        frac = f" = {best['frac_memcpy']:.0%}" if best["frac_memcpy"] is not None else ""
        print(f"bench reshard {model} ({best['device']} memory, {best['backend']}): planned best "
              f"{best['gbps']:.2f} GB/s at {best['p']}:{best['q']}{frac} of its d2d copy "
              f"{best['memcpy_gbps']:.1f} GB/s{d2d}")
if os.path.exists(os.path.join(out, "accuracy.tsv")):
    for line in open(os.path.join(out, "accuracy.tsv")):
        name, first, last = line.split()
        print(f"held-out accuracy {name}: {float(first):.3f} -> {float(last):.3f}")
EOF
echo "result: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
return $status
}

main 2>&1 | tee "$OUT/device_check.log"
exit "${PIPESTATUS[0]}"
