#!/usr/bin/env bash
# The GPU check: everything the first CUDA machine should tell us, in one run of under 8 minutes, on a bare
# image (torch + CUDA, numpy, Pillow, maybe pytest; no service stack, no network, no pip).
#
#   bash infra/gpu_check.sh                  # from the repository root; figures and logs under $OUT
#   OUT=/tmp/gpu GPU_CHECK_STEPS="env bench_resident" bash infra/gpu_check.sh
#   GPU_CHECK_DRY=1 bash infra/gpu_check.sh  # every step tiny, on the CPU (CI: tests/test_gpu_check.py)
#
# Steps (each under its own `timeout`, all under one global deadline; a failing step never stops the rest):
#   env             nvidia-smi, Python/torch/CUDA versions, which modules exist             -> env.txt, env.json
#   pytest_gpu      python -m pytest tests/gpu_worker -m gpu (the CUDA-only tests)           -> pytest_gpu.xml
#   bench_resident  python -m gpu_worker.bench_gpu --preset h200 --resolution 720p --chunks 50: cold and warm
#                   TTFF, frames/s, stage ms, memory after 10 and 50 chunks, A2V TFLOP/s, switch ms, FLOPs
#                                                                                            -> bench_resident.json
#   bench_switch    the same render with --residency switch: the switch time each chunk saw -> bench_switch.json
#   sp_check        the sequence-parallel kernels on one device (gpu_worker/distributed/sp_check.py): the SP path
#                   on a one-rank NCCL group with 1, 2 and 4 head groups against the plain layer, and one P = 8
#                   rank's attention overlapped with a copy of its all-to-all bytes on a second stream -> sp_check.json
#   record_*, gate_* render records (gpu_worker/render_record.py) bf16 resident, bf16 switch and fp32 resident
#                   ($RECORD_VARIANTS), and the quality gate (monologue/gate.py) between them, when those exist
#                                                                                 -> records/*.json, gate_*.out
#   infinitetalk    the infinitetalk family's 14B DiT random-initialised at its real shapes (bf16): build time,
#                   s per denoising step at 480p resident and in switch residency, peak memory -> infinitetalk.json
#                   (skipped, saying so, where diffusers is not installed: the family's models come from it)
# steps.tsv has one line per step: name, exit status (124/134/137: its timeout), seconds, limit.
# A step's stdout and stderr go to $OUT/NAME.out and $OUT/NAME.err (the bench prints progress on stderr, so a
# step killed by its timeout still says how far it got; bench_*.json is rewritten after every phase).
set -o pipefail
ulimit -c 0 || true
START=$(date +%s)
DEADLINE=${DEADLINE:-455}  # seconds from start: with the last kill grace and the wrap-up, under 8 minutes
OUT=${OUT:-$PWD/gpu_out}
PY=${PY:-$(command -v python || command -v python3)}
STEPS=${GPU_CHECK_STEPS:-"env pytest_gpu bench_resident bench_switch sp_check records infinitetalk"}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" TRITON_CACHE_DIR="$WORK/triton"

if [ -n "${GPU_CHECK_DRY:-}" ]; then  # the CPU dry run: every step tiny (the script's plumbing, not a card)
  BENCH=${BENCH_ARGS:-"--preset tiny --resolution 512 --chunks 2 --warmup-chunks 1 --chunk-frames 4 --no-flops"}
  SWITCH_BENCH=${SWITCH_BENCH_ARGS:-"$BENCH"}
  RECORD=${RECORD_ARGS:-"--preset tiny --resolution 512 --preview --seconds 0.2 --chunk-frames 4 --keep-frames 1"}
  SP_CHECK=${SP_CHECK_ARGS:-"--tiny --repeats 2"}
  INFINITETALK=${INFINITETALK_ARGS:-"--preset tiny --steps 1"}
else
  SP_CHECK=${SP_CHECK_ARGS:-"--repeats 20"}
  BENCH=${BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 50"}
  SWITCH_BENCH=${SWITCH_BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 12 --warmup-chunks 3"}
  RECORD=${RECORD_ARGS:-"--preset h200 --resolution 720p --seconds 1 --keep-frames 4"}
  INFINITETALK=${INFINITETALK_ARGS:-"--steps 2"}
fi

SUMMARY="$OUT/steps.tsv"
printf 'step\trc\tseconds\tlimit\n' > "$SUMMARY"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT CMD...: CMD's output in $OUT/NAME.{out,err}, for at most LIMIT s and never past the deadline
# (SIGABRT first, so Python's faulthandler prints where it was; SIGKILL 10 s later). Always returns 0.
step() {
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 20 ]; then printf '%s\tskipped\t0\t%s\n' "$name" "$limit" >> "$SUMMARY"; return 0; fi
  [ "$limit" -gt "$budget" ] && limit=$budget
  local t0; t0=$(date +%s)
  echo "== $name (at most ${limit} s)"
  timeout -s ABRT -k 10 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$SUMMARY"
  tail -n 3 "$OUT/$name.err" || true
  return 0
}

cat > "$WORK/env.py" << 'PYEOF'
"""Versions, the device, and which modules this image has (None: not installed)."""
import importlib, importlib.util, json, sys

import torch

names = ("numpy", "PIL", "safetensors", "accelerate", "triton", "cv2", "httpx", "pytest", "pydantic",
         "pydantic_settings", "temporalio", "av", "structlog", "fastapi", "sqlalchemy", "boto3", "psycopg")
modules = {}
for name in names:
    if importlib.util.find_spec(name) is None:
        modules[name] = None
        continue
    try:
        modules[name] = getattr(importlib.import_module(name), "__version__", "present")
    except Exception as err:  # there, but it does not import
        modules[name] = f"broken: {type(err).__name__}: {err}"
info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(), "modules": modules}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    info.update(device=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                memory_gib=round(props.total_memory / 2**30, 1))
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(json.dumps(info))
PYEOF

if wanted env; then
  {
    date -u; uname -a; nproc; free -g || true
    timeout 20 nvidia-smi || true
    timeout 20 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,pcie.link.gen.current \
      --format=csv || true
    git rev-parse HEAD 2> /dev/null || true
  } > "$OUT/env.txt" 2>&1
  step env 60 "$PY" "$WORK/env.py" "$OUT/env.json"
fi

if wanted pytest_gpu; then
  if "$PY" -c "import pytest" > /dev/null 2>&1; then
    step pytest_gpu 120 "$PY" -m pytest tests/gpu_worker -m gpu -q -rs -p no:cacheprovider \
      --junitxml="$OUT/pytest_gpu.xml"
  else
    printf 'pytest_gpu\tno-pytest\t0\t0\n' >> "$SUMMARY"
  fi
fi

# bench NAME LIMIT ARGS...: the benchmark's JSON in $OUT/NAME.json (rewritten after each phase), its text
# summary in NAME.out, a progress line per chunk and phase in NAME.err.
bench() {
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" "$PY" -m gpu_worker.bench_gpu "$@" --json-out "$OUT/$name.json" --progress
}
# shellcheck disable=SC2086  # the ARGS variables are word lists on purpose
if wanted bench_resident; then bench bench_resident 240 $BENCH; fi
# shellcheck disable=SC2086
if wanted bench_switch; then bench bench_switch 120 $SWITCH_BENCH --residency switch; fi
# shellcheck disable=SC2086
if wanted sp_check; then step sp_check 60 "$PY" -m gpu_worker.distributed.sp_check $SP_CHECK --json-out "$OUT/sp_check.json"; fi

# record PRECISION RESIDENCY: one render record (frames' hashes and a few frames) for the gate.
record() {
  # shellcheck disable=SC2086
  step "record_$1_$2" 90 "$PY" -m gpu_worker.render_record "$WORK/records/$1_$2" $RECORD \
    --precision "$1" --residency "$2"
  cp "$WORK/records/$1_$2/record.json" "$OUT/records/$1_$2.json" 2> /dev/null || true
}
# gate NAME BASELINE CANDIDATE: the quality gate between two records, when both were written.
gate() {
  if [ -f "$WORK/records/$2/record.json" ] && [ -f "$WORK/records/$3/record.json" ] && [ -f monologue/gate.py ]; then
    step "$1" 60 "$PY" -m monologue.gate "$WORK/records/$2" "$WORK/records/$3" --json
  fi
}
if wanted records && [ -f gpu_worker/render_record.py ]; then
  mkdir -p "$OUT/records"
  for variant in ${RECORD_VARIANTS:-bf16:resident bf16:switch fp32:resident}; do
    record "${variant%%:*}" "${variant##*:}"
  done
  gate gate_switch bf16_resident bf16_switch  # switch residency must equal resident bit for bit
  gate gate_bf16 fp32_resident bf16_resident  # bf16 weights must stay within the gate's band of fp32
fi

if wanted infinitetalk; then
  if "$PY" -c "import diffusers" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    step infinitetalk 150 "$PY" -m gpu_worker.models.infinitetalk.gpu_timing --json-out "$OUT/infinitetalk.json" $INFINITETALK
  else
    echo "== infinitetalk skipped: diffusers is not installed here (pip install diffusers transformers to time it)"
    printf 'infinitetalk\tno-diffusers\t0\t0\n' >> "$SUMMARY"
  fi
fi

timeout 20 nvidia-smi --query-gpu=memory.used,temperature.gpu,clocks.sm --format=csv > "$OUT/nvidia_smi_end.txt" 2>&1 \
  || true
echo "total seconds: $(( $(date +%s) - START ))" >> "$SUMMARY"
cat "$SUMMARY"
exit 0
