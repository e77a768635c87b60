#!/usr/bin/env bash
# Issue 13's GPU checks and figures in one run, on a machine with one CUDA GPU (H100 or H200).
#
#   bash benchmarks/gpu_suite.sh [OUT_DIR [PART...]]   # default benchmarks/results/gpu-<date>, all
#
# Parts, in order (name some to run only those, e.g. one per call where a command has a time limit):
#   tests  the CUDA tests: golden TensorFlow parity in fp32, CPU parity, bf16 against fp32 over
#          300 steps, the LSTM variants;
#   speed  gpu_bilm.py at original size for each LSTM variant (reference, compiled, graphed: each
#          with the directions apart and batched): a batch sweep, where the time goes, inference;
#          speed-reference, speed-compiled and speed-graphed run one variant each;
#   data   the data path on this machine's CPUs;
#   recipe 300 steps of original at 128 rows against 1024 rows at two learning rates
#          (batch_recipe.py; PTB when shared/data/ptb is there, else the bundled python-docs,
#          whose 277k training tokens a 1024-row run reads 22 times: copy ../shared/data/ptb to
#          shared/data/ptb in the working tree to send PTB to the GPU machine).
# Every log lands in OUT_DIR; each tool's last line is JSON.
#
# Needs torch with CUDA, numpy, pyarrow, pyyaml, h5py, tqdm, typer, pytest(-timeout), and the pure
# Python pydantic, sacremoses (elmo_core's configs and Moses tokenizer) with pydantic-core: no Ray,
# MLflow or Prefect. On a machine without a package index, bring them as wheels at the versions
# constraints.txt pins (pydantic, pydantic_core, annotated-types, typing-inspection, sacremoses;
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`) and install them with
# `pip install --no-index --no-deps --target DIR` on PYTHONPATH. The golden files are read from
# ELMO_TEST_CACHE (the parity test fetches them once where a package index is reachable; point the
# variable at a copy where none is).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu-$(date +%F)}
shift $(($# > 0 ? 1 : 0))
parts=${*:-tests speed data recipe}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" |
    tee -a "$out/gpu.txt"

if [[ " $parts " == *" tests "* ]]; then
    python -m pytest -q -p no:cacheprovider \
        tests/integration/test_allennlp_parity.py \
        tests/unit/elmo_core/training \
        tests/unit/elmo_core/model/test_lstm_cudnn.py \
        tests/unit/elmo_core/model/test_lstm_compiled.py \
        tests/unit/elmo_core/model/test_lstm_batched.py \
        tests/unit/elmo_core/model/test_bilm_autocast.py 2>&1 | tee "$out/tests.log" || status=1
fi

for impl in reference compiled graphed; do
    if [[ " $parts " == *" speed "* || " $parts " == *" speed-$impl "* ]]; then
        for directions in "" --batch-directions; do
            python benchmarks/gpu_bilm.py --lstm-impl "$impl" $directions --sweep 256,512,1024 \
                --profile --inference 2>&1 | tee "$out/gpu_bilm-$impl$directions.log" || status=1
        done
    fi
done

if [[ " $parts " == *" data "* ]]; then
    python benchmarks/bench_data_path.py --corpus python-docs 2>&1 |
        tee "$out/data_path.log" || status=1
fi
if [[ " $parts " == *" recipe "* ]]; then
    corpus=(--corpus python-docs)
    [[ -d shared/data/ptb ]] && corpus=(--corpus ptb --data-root shared/data)
    python benchmarks/batch_recipe.py "${corpus[@]}" 2>&1 | tee "$out/batch_recipe.log" || status=1
fi
exit $status
