#!/usr/bin/env bash
# The GPU checks and figures, one part per device command (each fits its 10 minutes), on a machine
# with one CUDA GPU and no package index; rehearsed on any CPU first (infra/device/rehearse.py).
#
#   bash infra/device/gpu_suite.sh [--carried DIR] [--rehearse] OUT PART...
#
# Parts:
#   first-contact    the first call on a lent GPU, in 7 minutes (infra/device/first_contact.py):
#                    environment and matmul peak, CUDA correctness, speed at original (graphed,
#                    fused and the captured step at 128 and 1,024 rows, straightforward), a fused
#                    step's profile, inference if time remains; each stage boxed,
#                    OUT/first-contact.log appended as each ends, its last line one JSON object.
#                    The device call:
#                      run {"command": "bash infra/device/gpu_suite.sh --carried .device $OUT
#                           first-contact", "carry": [".device"], "timeout_s": 480}
#   tests            the CUDA tests: golden TensorFlow parity in fp32, CPU parity, bf16 against
#                    fp32 over 300 steps, every LSTM variant (the fused one's Triton steps
#                    included), the compiled softmax epilogues, the step's host-sync check, the
#                    captured step against the eager one;
#                    GPU_TESTS="PATH..." runs those pytest paths instead (a short call's re-check);
#   speed-IMPL       gpu_bilm.py at original size, 128 rows, IMPL = reference, compiled, graphed or
#                    fused (each layer one op with its own backward),
#                    directions apart and batched: ours against the straightforward baseline, MFU,
#                    where a step's time goes;
#   sweep-IMPL       ours at 256, 512 and 1024 rows, directions batched;
#   profile-IMPL     where ours spends a step (directions batched) at 128 and 1,024 rows, alone;
#                    IMPL = captured: the whole step replayed (train.capture_step);
#   ab               fused (directions batched) at 128 and 1,024 rows, from each DIR/baseline-K
#                    (trees made by python -m infra.device.device_env baseline REF... DIR) and
#                    from this tree, alternated twice, or AB_ROUNDS times (infra/device/ab.py): each
#                    change against the tree before it, in the same call;
#   ab-graphed       this tree's fused against graphed (fused's ops replayed as CUDA graphs) at 128
#                    and 1,024 rows, directions batched, alternated twice (infra/device/ab.py);
#   ab-captured      graphed (the CUDA default) against the whole step captured (train.capture_step)
#                    at 128 and 1,024 rows, directions batched, alternated twice;
#   two-ranks        gloo ranks on CUDA device 0 (NCCL refuses two ranks on one device): 20
#                    steps train as one rank on all ranks' rows, for each exchange; then
#                    original at 128 rows a rank: bytes sent a step, dense and rows apart, each
#                    exchange's time, summing gathered rows at 2, 8, 16 workers (two_ranks.py);
#   inference        embedding 64 sentences with the frozen biLM (reference, compiled, fused);
#   data             the data path on this machine's CPUs;
#   recipe           300 steps of original at 128 rows against 1024 rows at two learning rates
#                    (PTB when shared/data/ptb is in the tree, else the bundled python-docs).
# --carried DIR: DIR/wheels/*.whl are installed as the device lacks them (python -m
#   infra.device.device_env fetch DIR makes it). The golden files travel in the tree
#   (tests/fixtures/bilm_tf).
# --rehearse: tiny sizes on a CPU; the meta device stands in for CUDA where the code allows it
#   (every tensor must be on it, as on a GPU), the compiled loops compile for the CPU.
# Each part writes OUT/PART.log (its last line JSON) and no more than 3 files in all.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
carried="" rehearse=""
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in
        --carried) carried=$(cd "$2" && pwd); shift 2 ;;
        --rehearse) rehearse=1; shift ;;
        *) echo "gpu_suite.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ $# -lt 2 ]]; then
    echo "usage: gpu_suite.sh [--carried DIR] [--rehearse] OUT PART..." >&2
    exit 2
fi
out=$1
shift
mkdir -p "$out"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n $carried ]]; then
    site=$(mktemp -d /tmp/elmo-site.XXXX)
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$carried"/wheels/*.whl || exit 1
    export PYTHONPATH="$site:$PYTHONPATH"
fi
{
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$python" -c "import sys, torch; print('python', sys.version.split()[0], 'torch',
        torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} >"$out/env.txt" 2>&1
if [[ -z $rehearse ]] && ! "$python" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_suite.sh: no CUDA device here; on a CPU, rehearse: python -m infra.device.rehearse" >&2
    exit 2
fi

bilm() {  # gpu_bilm.py at original size, or tiny in a rehearsal: there the eager loops' training
    local impl=$1 # runs on the meta device (inference finds token types on the device, which
    shift         # meta cannot), the compiled loops on the CPU
    local size=()
    if [[ -n $rehearse ]]; then
        size=(--smoke)
        [[ $impl =~ ^(reference|fused)$ && " $* " != *" inference "* ]] && size+=(--device meta)
    fi
    "$python" -m infra.device.gpu_bilm --lstm-impl "$impl" "${size[@]}" "$@"
}

run_part() {
    local part=$1
    # A fresh Inductor cache per part: a compile killed at the limit leaves no truncated file to
    # a later part.
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/inductor-"$part".XXXX)
    export TORCHINDUCTOR_CACHE_DIR
    case $part in
        first-contact)
            "$python" -m infra.device.first_contact "$out" ${rehearse:+--rehearse} ;;
        tests)
            local paths=(
                tests/integration/test_allennlp_parity.py
                tests/unit/elmo_core/training
                tests/unit/elmo_core/model/lstm/test_cudnn.py
                tests/unit/elmo_core/model/lstm/test_compiled.py
                tests/unit/elmo_core/model/lstm/test_directions.py
                tests/unit/elmo_core/model/lstm/test_fused_training.py
                tests/unit/elmo_core/model/lstm/test_fused_inference.py
                tests/unit/elmo_core/model/lstm/test_triton_kernels.py
                tests/unit/elmo_core/model/test_bilm_autocast.py
                tests/unit/elmo_core/model/test_softmax.py
            )
            [[ -n ${GPU_TESTS:-} ]] && read -ra paths <<<"$GPU_TESTS"
            PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$python" -m pytest -q -p pytest_timeout \
                -p no:cacheprovider --junitxml "$out/tests.xml" "${paths[@]}" ;;
        speed-reference | speed-compiled | speed-graphed | speed-fused)
            bilm "${part#speed-}" --profile && bilm "${part#speed-}" --batch-directions --profile ;;
        profile-reference | profile-compiled | profile-graphed | profile-fused)
            bilm "${part#profile-}" --batch-directions --only profile &&
                bilm "${part#profile-}" --batch-directions --only profile --batch 1024 ;;
        profile-captured)
            bilm fused --batch-directions --capture-step --only profile &&
                bilm fused --batch-directions --capture-step --only profile --batch 1024 ;;
        sweep-reference | sweep-compiled | sweep-graphed | sweep-fused)
            local rows=256,512,1024
            [[ -n $rehearse ]] && rows=6,8
            bilm "${part#sweep-}" --batch-directions --only sweep --sweep "$rows" ;;
        ab)
            local trees=() k=1
            while [[ -f $carried/baseline-$k/COMMIT ]]; do
                trees+=("$carried/baseline-$k")
                k=$((k + 1))
            done
            if [[ ${#trees[@]} -eq 0 ]]; then
                echo "gpu_suite.sh: ab times this tree against --carried DIR's DIR/baseline-K:" \
                    "python -m infra.device.device_env baseline REF... DIR makes them" >&2
                return 2
            fi
            local size=(--rounds "${AB_ROUNDS:-2}" --sweep 128,1024)
            [[ -n $rehearse ]] && size=(--rounds 1 --smoke --device meta --sweep 6,8)
            "$python" -m infra.device.ab "${trees[@]}" --lstm-impl fused --batch-directions \
                --only sweep "${size[@]}" ;;
        ab-graphed)
            local size=(--sweep 128,1024)
            [[ -n $rehearse ]] && size=(--rounds 1 --smoke --sweep 6,8)
            "$python" -m infra.device.ab --impls fused,graphed --batch-directions --only sweep \
                "${size[@]}" ;;
        ab-captured)
            local size=(--sweep 128,1024)
            [[ -n $rehearse ]] && size=(--rounds 1 --smoke --sweep 6,8)
            "$python" -m infra.device.ab --impls graphed,captured --batch-directions --only sweep \
                "${size[@]}" ;;
        two-ranks)
            local size=()
            [[ -n $rehearse ]] && size=(--smoke)
            PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$python" -m pytest -q -p pytest_timeout \
                -p no:cacheprovider --junitxml "$out/two-ranks.xml" -k "ranks_train or launched" \
                tests/unit/elmo_core/training/test_gradient_exchange.py &&
                "$python" -m infra.device.two_ranks "${size[@]}" ;;
        inference)
            bilm reference --only inference &&
                bilm compiled --batch-directions --only inference &&
                bilm fused --batch-directions --only inference ;;
        data)
            local size=()
            [[ -n $rehearse ]] && size=(--steps 20 --repeats 1)
            "$python" -m benchmarks.bench_data_path --corpus python-docs "${size[@]}" ;;
        recipe)
            local corpus=(--corpus python-docs) size=()
            [[ -d shared/data/ptb ]] && corpus=(--corpus ptb --data-root shared/data)
            [[ -n $rehearse ]] && size=(--preset tiny --rows 256 --steps 2)
            "$python" -m experiments.batch_recipe "${corpus[@]}" "${size[@]}" ;;
        *)
            echo "gpu_suite.sh: unknown part $part" >&2
            return 2 ;;
    esac
}

status=0
for part in "$@"; do
    if [[ $part == first-contact ]]; then  # it writes its own log, stage by stage
        run_part "$part" || status=1
    else
        run_part "$part" 2>&1 | tee "$out/$part.log" || status=1
    fi
done
exit $status
