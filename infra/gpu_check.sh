#!/usr/bin/env bash
# The GPU check: everything the first CUDA machine should tell us, in one run of at most 9 minutes (one 600-s
# device call), on the lent image: Python 3.12, torch + CUDA, triton, numpy, safetensors, accelerate, pytest,
# transformers; no service stack, no network. diffusers is not there: bring it as wheels (see below) or the
# infinitetalk step and its tests are skipped, saying so.
#
#   bash infra/gpu_check.sh                  # from the repository root; results in $OUT (default gpu_out/)
#   OUT=/tmp/gpu GPU_CHECK_STEPS="env bench_resident" bash infra/gpu_check.sh
#   GPU_CHECK_DRY=1 bash infra/gpu_check.sh  # every step tiny, on the CPU (CI: tests/test_gpu_check.py)
#   bash infra/wheelhouse.sh                 # here, once: the wheels the image lacks into .whl/ (git-ignored);
#                                            # the device call names .whl in `carry`, this script installs them
#
# Steps, in order of value (each under its own `timeout`, all under one deadline; a failing step never stops the
# rest; a step the deadline leaves no room for is skipped, saying so):
#   env             nvidia-smi, Python/torch/CUDA versions, which modules exist                 -> env.json
#   pytest_gpu      python -m pytest tests/gpu_worker -m gpu (the CUDA-only tests; modules whose packages are
#                   missing are skipped with the reason)                                         -> pytest_gpu.xml
#   build           the dit preset's random weights written once as a checkpoint (make_checkpoint), which every
#                   later step loads instead of drawing 1 B parameters on the CPU again
#   bench_resident  python -m gpu_worker.bench_gpu at 720p with few chunks: cold and warm TTFF, frames/s, stage ms,
#                   memory, A2V TFLOP/s, switch ms, FLOPs                                        -> bench_resident.json
#   infinitetalk    the infinitetalk family's 14B DiT random-initialised at its real shapes (bf16): build time, s per
#                   denoising step at 480p (quality: 3 passes; fast: 1), one pass's TFLOP and TFLOP/s, resident and
#                   in switch residency, peak memory (126 s on an H200: pinning 38 GB dominates) -> infinitetalk.json
#   sp_check        the sequence-parallel kernels on one device (gpu_worker/distributed/sp_check.py): the SP path on
#                   a one-rank NCCL group with 1, 2 and 4 head groups against the plain layer, and one P = 8 rank's
#                   attention overlapped with a copy of its all-to-all bytes on a second stream  -> sp_check.json
#   decoder_timing  the dit decoder's per-frame stage alone at 720p in the layouts it could run in (NCHW as today,
#                   channels-last, 4 frames a batch, compiled): ms, TFLOP/s, difference    -> decoder_timing.json
#   wan_vae         the Wan VAE's calls per infinitetalk chunk at 480p (a kept state's decode of 18 latents, a
#                   38-latent priming, the motion and condition encodes) in fp32, bf16 and bf16 channels-last
#                   (gpu_worker/models/infinitetalk/vae_timing.py; needs diffusers)      -> wan_vae.json
#   bench_compiled  the same render with the DiTs' steps compiled at load (--compile: CUDA graphs) -> bench_compiled.json
#   bench_switch    the same render with --residency switch: the switch time each chunk saw     -> bench_switch.json
#   bench_fp8       the same render with the DiTs' block weights in float8 (--quantize fp8; int8 in the dry run)
#   bench_eager_decoder  bench_resident's render with the decoder's per-frame stage eager (MONOLOGUE_COMPILE_DECODER=off;
#                   on by default with CUDA): the A/B of compiling it                    -> bench_eager_decoder.json
#   records         render records (gpu_worker/render_record.py) bf16 resident, bf16 switch and fp32 resident
#                   ($RECORD_VARIANTS, PRECISION:RESIDENCY[:eager]), and the quality gate (monologue/gate.py)
#                   between them (bf16:resident:eager against bf16:resident: the compiled decoder) -> records/, gate_*.out
#
# What comes back is three files (the device tool returns at most 8): $OUT/steps.tsv (name, exit status or
# "skipped", seconds, limit, why), $OUT/summary.json (the steps, the environment, every step's figures, the GPU
# tests' outcome) and $OUT/gpu_check.tar.gz (everything: each step's JSON, stdout and stderr, the records).
# Exit status 124/134/137 in steps.tsv: the step's timeout. A step's progress is on its stderr, so a step killed by
# its timeout still says how far it got (bench_*.json is rewritten after every phase).
set -o pipefail
ulimit -c 0 || true
START=$(date +%s)
DEADLINE=${DEADLINE:-530}  # seconds from start: with the last kill grace and the packing, within one 600-s call
OUT=${OUT:-$PWD/gpu_out}
PY=${PY:-$(command -v python || command -v python3)}
STEPS=${GPU_CHECK_STEPS:-"env pytest_gpu build bench_resident infinitetalk sp_check decoder_timing wan_vae bench_compiled bench_switch bench_fp8 bench_eager_decoder records"}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
RAW="$WORK/out"  # every step's files; packed into $OUT at the end
mkdir -p "$RAW"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" TRITON_CACHE_DIR="$WORK/triton"

# Wheels brought along (infra/wheelhouse.sh; the device call carries .whl): installed beside the image's packages.
WHEELS=${WHEELHOUSE:-.whl}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$WHEELS"/*.whl > "$RAW/wheels.out" 2>&1; then
    export PYTHONPATH="$WORK/site:$PYTHONPATH"
  else
    echo "== the wheels in $WHEELS did not install (see wheels.out in the tarball)"
  fi
fi

if [ -n "${GPU_CHECK_DRY:-}" ]; then  # the CPU dry run: every step tiny (the script's plumbing, not a card)
  PRESET=tiny
  BENCH=${BENCH_ARGS:-"--preset tiny --resolution 512 --chunks 2 --warmup-chunks 1 --chunk-frames 4 --no-flops"}
  SWITCH_BENCH=${SWITCH_BENCH_ARGS:-"$BENCH"}
  COMPILED_BENCH=${COMPILED_BENCH_ARGS:-"$BENCH"}
  RECORD=${RECORD_ARGS:-"--preset tiny --resolution 512 --preview --seconds 0.2 --chunk-frames 4 --keep-frames 1"}
  SP_CHECK=${SP_CHECK_ARGS:-"--tiny --repeats 2"}
  INFINITETALK=${INFINITETALK_ARGS:-"--preset tiny --steps 1"}
  DECODER=${DECODER_ARGS:-"--preset tiny --resolution 512 --frames 8 --repeats 1 --variants nchw,nhwc,nhwc_batch4"}
  WAN_VAE=${WAN_VAE_ARGS:-"--preset tiny --latents 4 --repeats 1"}
  QUANT_BENCH=${QUANT_BENCH_ARGS:-"$BENCH --quantize int8"}
else
  PRESET=h200
  SP_CHECK=${SP_CHECK_ARGS:-"--repeats 20"}
  BENCH=${BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 20"}
  SWITCH_BENCH=${SWITCH_BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 8 --warmup-chunks 2"}
  COMPILED_BENCH=${COMPILED_BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 8 --warmup-chunks 2"}
  RECORD=${RECORD_ARGS:-"--preset h200 --resolution 720p --seconds 1 --keep-frames 4"}
  INFINITETALK=${INFINITETALK_ARGS:-"--steps 2"}
  DECODER=${DECODER_ARGS:-"--preset h200 --resolution 720p --frames 40"}
  WAN_VAE=${WAN_VAE_ARGS:-""}
  QUANT_BENCH=${QUANT_BENCH_ARGS:-"--preset h200 --resolution 720p --chunks 8 --warmup-chunks 2 --quantize fp8"}
fi

SUMMARY="$RAW/steps.tsv"
printf 'step\trc\tseconds\tlimit\twhy\n' > "$SUMMARY"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
skipped() { printf '%s\tskipped\t0\t0\t%s\n' "$1" "$2" >> "$SUMMARY"; echo "== $1 skipped: $2"; }

# step NAME LIMIT CMD...: CMD's output in $RAW/NAME.{out,err}, for at most LIMIT s and never past the deadline
# (SIGABRT first, so Python's faulthandler prints where it was; SIGKILL 10 s later). Always returns 0.
step() {
  local name=$1 limit=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 20 ]; then skipped "$name" "no time left before the deadline (${DEADLINE} s)"; return 0; fi
  [ "$limit" -gt "$budget" ] && limit=$budget
  local t0; t0=$(date +%s)
  echo "== $name (at most ${limit} s)"
  timeout -s ABRT -k 10 "$limit" "$@" > "$RAW/$name.out" 2> "$RAW/$name.err"
  local rc=$?
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$SUMMARY"
  tail -n 3 "$RAW/$name.err" || true
  return 0
}

cat > "$WORK/env.py" << 'PYEOF'
"""Versions, the device, and which modules this image has (None: not installed)."""
import importlib, importlib.util, json, sys

import torch

names = ("numpy", "PIL", "safetensors", "accelerate", "triton", "cv2", "httpx", "pytest", "diffusers",
         "transformers", "pydantic",
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
  } > "$RAW/env.txt" 2>&1
  step env 60 "$PY" "$WORK/env.py" "$RAW/env.json"
fi

if wanted pytest_gpu; then
  if "$PY" -c "import pytest" > /dev/null 2>&1; then
    step pytest_gpu 120 "$PY" -m pytest tests/gpu_worker -m gpu -q -rs -p no:cacheprovider \
      --junitxml="$RAW/pytest_gpu.xml"
  else
    skipped pytest_gpu "pytest is not installed here"
  fi
fi

# The preset's weights, once: every later dit step loads them (a checkpoint folder) instead of drawing them again.
WEIGHTS=()
if wanted build; then
  step build 90 "$PY" -m gpu_worker.models.dit.make_checkpoint "$WORK/weights" --preset "$PRESET" --seed 1
  [ -f "$WORK/weights/config.json" ] && WEIGHTS=(--weights "$WORK/weights")
fi

# bench NAME LIMIT ARGS...: the benchmark's JSON in $RAW/NAME.json (rewritten after each phase), its text
# summary in NAME.out, a progress line per chunk and phase in NAME.err.
bench() {
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" "$PY" -m gpu_worker.bench_gpu "$@" "${WEIGHTS[@]}" --json-out "$RAW/$name.json" --progress
}
# shellcheck disable=SC2086  # the ARGS variables are word lists on purpose
if wanted bench_resident; then bench bench_resident 180 $BENCH; fi

if wanted infinitetalk; then
  if "$PY" -c "import diffusers" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    step infinitetalk 160 "$PY" -m gpu_worker.models.infinitetalk.gpu_timing --json-out "$RAW/infinitetalk.json" \
      $INFINITETALK
  else
    skipped infinitetalk "diffusers is not installed here (bash infra/wheelhouse.sh, and carry .whl)"
  fi
fi

# shellcheck disable=SC2086
if wanted sp_check; then step sp_check 60 "$PY" -m gpu_worker.distributed.sp_check $SP_CHECK --json-out "$RAW/sp_check.json"; fi
# shellcheck disable=SC2086
if wanted decoder_timing; then
  step decoder_timing 120 "$PY" -m gpu_worker.models.dit.decoder_timing $DECODER --json-out "$RAW/decoder_timing.json"
fi
if wanted wan_vae; then
  if "$PY" -c "import diffusers" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    step wan_vae 150 "$PY" -m gpu_worker.models.infinitetalk.vae_timing $WAN_VAE --json-out "$RAW/wan_vae.json"
  else
    skipped wan_vae "diffusers is not installed here (bash infra/wheelhouse.sh, and carry .whl)"
  fi
fi
# shellcheck disable=SC2086  # the DiTs' steps compiled at load (CUDA graphs), against bench_resident's eager steps
if wanted bench_compiled; then bench bench_compiled 240 $COMPILED_BENCH --compile; fi  # past 150 s compiling on an H200 (2026-12-04)
# shellcheck disable=SC2086
if wanted bench_switch; then bench bench_switch 90 $SWITCH_BENCH --residency switch; fi
# shellcheck disable=SC2086
if wanted bench_fp8; then bench bench_fp8 100 $QUANT_BENCH; fi
# shellcheck disable=SC2086  # bench_resident's render with the decoder's per-frame stage eager: the A/B of compiling it
if wanted bench_eager_decoder; then (export MONOLOGUE_COMPILE_DECODER=off; bench bench_eager_decoder 180 $BENCH); fi

# record PRECISION RESIDENCY [eager]: one render record (frames' hashes and a few frames) for the gate; "eager" runs
# the decoder's per-frame stage uncompiled (MONOLOGUE_COMPILE_DECODER=off), for the gate between the two.
record() {  # fp32 compiles its own kernels: past 60 s on the first H200 run (2026-12-04); bf16 took 33 s
  local limit=60 name="$1_$2${3:+_$3}"; [ "$1" = fp32 ] && limit=100
  (
    [ "${3:-}" = eager ] && export MONOLOGUE_COMPILE_DECODER=off
    # shellcheck disable=SC2086
    step "record_$name" "$limit" "$PY" -m gpu_worker.render_record "$WORK/records/$name" $RECORD "${WEIGHTS[@]}" \
      --precision "$1" --residency "$2"
  )
  cp "$WORK/records/$name/record.json" "$RAW/records/$name.json" 2> /dev/null || true
}
# gate NAME BASELINE CANDIDATE: the quality gate between two records, when both were written.
gate() {
  if [ -f "$WORK/records/$2/record.json" ] && [ -f "$WORK/records/$3/record.json" ]; then
    step "$1" 60 "$PY" -m monologue.gate "$WORK/records/$2" "$WORK/records/$3" --json
  else
    skipped "$1" "a record it compares was not written"
  fi
}
if wanted records; then
  mkdir -p "$RAW/records"
  for variant in ${RECORD_VARIANTS:-bf16:resident bf16:switch fp32:resident}; do
    IFS=: read -r precision residency decoder <<< "$variant"
    record "$precision" "$residency" "$decoder"
  done
  gate gate_switch bf16_resident bf16_switch  # switch residency must equal resident bit for bit
  case " ${RECORD_VARIANTS:-fp32:resident} " in
    *" fp32:resident "*) gate gate_bf16 fp32_resident bf16_resident ;;  # bf16 within the gate's band of fp32
  esac
  case " ${RECORD_VARIANTS:-} " in  # the compiled decoder within the gate's band of the eager one
    *" bf16:resident:eager "*) gate gate_decoder bf16_resident_eager bf16_resident ;;
  esac
fi

timeout 20 nvidia-smi --query-gpu=memory.used,temperature.gpu,clocks.sm --format=csv > "$RAW/nvidia_smi_end.txt" 2>&1 \
  || true
echo "total seconds: $(( $(date +%s) - START ))" >> "$SUMMARY"
cp "$SUMMARY" "$OUT/steps.tsv"
"$PY" infra/gpu_summary.py "$RAW" "$OUT/summary.json" || echo "== the summary was not written"
tar -czf "$OUT/gpu_check.tar.gz" -C "$RAW" .
cat "$OUT/steps.tsv"
exit 0
