#!/usr/bin/env bash
# The checks that need a GPU, in one bounded run on a machine with one CUDA device (CI has none).
#
#   bash scripts/gpu-check.sh [OUTDIR]
#
# Runs: the unit suite and the GPU-touching integration tests with CUDA present (the CUDA/NCCL tests run
# instead of skipping), the CUDA benchmark (benchmarks/bench_cuda.py), the join protocol at 1024-4096
# simulated ranks on this machine's cores, and the README's doctor command (4 ranks) plus a 1-rank NCCL
# doctor. Results (cuda.*, scale/scale.*) and one log of every step (steps.log) go to OUTDIR (default $OUT,
# else a temporary directory): few files, as a device run brings back at most 8. Every step has its own
# time limit. When a folder .whl/ holds wheels (distinit's own, built from this tree, and its runtime
# dependencies), they are installed into /tmp/site first, for a machine with torch but no registry.
# STEPS="tests-unit bench-cuda" runs only the named steps.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:-${OUT:-$(mktemp -d)}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ -d .whl ]; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
status=0
step() {  # step NAME LIMIT_S COMMAND...: run one step under its own limit, its output appended to OUTDIR/steps.log
    local name=$1 limit=$2
    shift 2
    case " ${STEPS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
    local t0=$SECONDS log=/tmp/gpu-check-$name.log
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    { echo "======== $name: exit $rc in $((SECONDS - t0)) s: $*"; cat "$log"; } >>"$out/steps.log"
    echo "== $name: exit $rc in $((SECONDS - t0)) s"
    tail -n 4 "$log"
    [ $rc -eq 0 ] || status=1
}
{
    nvidia-smi -L
    $py -c 'import torch, distinit; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "distinit", distinit.__file__)'
    nproc
} 2>&1 | tee "$out/machine.txt"
tests=(
    tests/integration/broadcast/test_cuda_paths.py tests/integration/broadcast/test_tensor.py
    tests/integration/broadcast/test_digest_path.py tests/integration/doctor/test_doctor_nccl.py
    tests/integration/doctor/test_doctor_world.py tests/integration/testing/test_plugin_reports.py
    tests/integration/doctor/test_doctor_progress_live.py
)
step tests-integration 180 $py -m pytest -p no:cacheprovider -q -rs "${tests[@]}"
step bench-cuda 120 $py benchmarks/bench_cuda.py --out "$out"
step scale-join 120 $py benchmarks/bench_scale.py --parts join --join 1024 2048 4096 --out "$out/scale"
step doctor-nccl-1 60 torchrun --standalone --nproc-per-node=1 --no-python distinit doctor
step doctor-readme-4 90 torchrun --standalone --nproc-per-node=4 --no-python distinit doctor
step tests-unit 80 $py -m pytest -p no:cacheprovider -q -rfE tests/unit
exit $status
