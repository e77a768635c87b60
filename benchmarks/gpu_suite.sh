#!/usr/bin/env bash
# Issue 13's GPU checks and figures in one run, on a machine with one CUDA GPU (H100 or H200).
#
#   bash benchmarks/gpu_suite.sh [OUT_DIR]        # default benchmarks/results/gpu-<date>
#
# Correctness first (the CUDA tests: golden TensorFlow parity in fp32, CPU parity, bf16 against
# fp32 over 300 steps, the LSTM variants), then speed: gpu_bilm.py for the reference and the
# compiled LSTM (original size, a batch sweep, where the time goes, inference), and the data path
# on this machine's CPUs. Every log lands in OUT_DIR; each tool's last line is JSON.
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
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" |
    tee -a "$out/gpu.txt"

python -m pytest -q -p no:cacheprovider \
    tests/integration/test_allennlp_parity.py \
    tests/unit/elmo_core/training \
    tests/unit/elmo_core/model/test_lstm_cudnn.py \
    tests/unit/elmo_core/model/test_lstm_compiled.py \
    tests/unit/elmo_core/model/test_bilm_autocast.py 2>&1 | tee "$out/tests.log" || status=1

for impl in reference compiled; do
    python benchmarks/gpu_bilm.py --lstm-impl "$impl" --sweep 256,512,1024 --profile \
        --inference 2>&1 | tee "$out/gpu_bilm-$impl.log" || status=1
done

python benchmarks/bench_data_path.py --corpus python-docs 2>&1 |
    tee "$out/data_path.log" || status=1
exit $status
