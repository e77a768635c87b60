import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from elmo_core.presets import model_preset
from elmo_core.training.batches import TYPES_PER_OCTAVE, bucket

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture
def gpu_bilm():
    from infra.device import gpu_bilm

    return gpu_bilm


def _assert_rates_agree(summary: dict, names: list[str]) -> None:
    """The ratio is the two steps' rates over the same positions; MFU is a rate times one
    constant (FLOPs per position over the measured peak), the same for every step timed."""
    rates = {name: summary[f"{name}_positions_per_s"] for name in names}
    assert summary["ratio"] == pytest.approx(rates["ours"] / rates["straightforward"], rel=1e-2)
    per_position = {name: summary[f"{name}_mfu"] / rate for name, rate in rates.items()}
    assert per_position == pytest.approx({name: per_position["ours"] for name in names}, rel=2e-2)


def test_counts_the_design_notes_flops_for_the_original_model(gpu_bilm):
    # docs/architecture.md, "Where a step's time goes": ≈ 274 MFLOP forward, ≈ 0.8 GFLOP per
    # training position (both directions)
    flops = gpu_bilm.training_flops_per_position(model_preset("original"))
    assert 0.80e9 < flops < 0.84e9


def test_smoke_run_times_both_implementations_sweeps_profiles_and_ends_with_json():
    result = subprocess.run(
        [sys.executable, "-m", "infra.device.gpu_bilm", "--smoke", "--batch-directions"]
        + ["--sweep", "8", "--profile", "--inference"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["preset"] == "tiny" and summary["batch_directions"] is True
    _assert_rates_agree(summary, ["ours", "straightforward", "ours@8"])
    assert isinstance(summary["profile"], dict)  # no CUDA kernels on a CPU: the keys vary
    assert summary["inference_ours_tokens_per_s"] > 0


def test_the_gpu_suite_parses_and_names_files_and_modules_that_exist():
    suite = REPO / "infra" / "device" / "gpu_suite.sh"
    assert subprocess.run(["bash", "-n", str(suite)], capture_output=True).returncode == 0
    named = re.findall(r"(?:tests|benchmarks|experiments|infra)/[\w/]+\.py", suite.read_text())
    assert named and all((REPO / path).is_file() for path in named), named
    run = re.findall(r"-m ((?:benchmarks|experiments|infra)\.[\w.]+)", suite.read_text())
    modules = [REPO / f"{module.replace('.', '/')}.py" for module in run]
    assert len(modules) >= 5 and all(path.is_file() for path in modules), run


def test_on_the_meta_device_both_steps_keep_every_tensor_on_the_models_device(gpu_bilm, capsys):
    """The meta device stands in for CUDA: a host tensor meeting a device tensor fails there."""
    assert gpu_bilm.main(["--smoke", "--device", "meta", "--batch-directions"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["device"] == "meta"
    _assert_rates_agree(summary, ["ours", "straightforward"])


def test_capture_step_pads_the_workload_to_buckets_and_runs_it_eagerly_off_cuda(gpu_bilm, capsys):
    """The shapes a captured step replays, rehearsed on the meta device (no graphs there)."""
    arguments = ["--smoke", "--device", "meta", "--batch-directions", "--sweep", "9"]
    assert gpu_bilm.main(arguments) == 0  # unbucketed: the step's distinct types alone
    distinct = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ours@9_token_types"]
    assert gpu_bilm.main([*arguments, "--capture-step"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["capture_step"] is False  # no graphs on the meta device: eager steps
    positions = 2 * 9 * summary["window"]  # both streams' windows of 9 rows
    padded = summary["ours@9_token_types"]  # 9 rows draw 33 types, not a bucket size
    assert padded == bucket(distinct, positions, TYPES_PER_OCTAVE) > distinct
    _assert_rates_agree(summary, ["ours", "straightforward", "ours@9"])


def test_a_host_tensor_in_the_baseline_fails_on_the_meta_device(gpu_bilm, monkeypatch):
    softmax = gpu_bilm.StraightforwardBiLM.softmax

    def with_host_tensor(self, hidden, targets):
        return softmax(self, hidden, targets) + torch.zeros(1)  # as candidates left on the host

    monkeypatch.setattr(gpu_bilm.StraightforwardBiLM, "softmax", with_host_tensor)
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        gpu_bilm.main(["--smoke", "--device", "meta"])


def test_the_profile_split_counts_each_kernel_once_by_its_kind(gpu_bilm):
    """An aten op's device time is its kernels' again: the split sums the device's own events
    (first contact's split counted each kernel twice, benchmarks/results/
    gpu_first_contact-2026-11-27.md)."""
    events = [
        _event("aten::bmm", CPU, device_us=3000.0),  # the host op, carrying its GEMM's time
        _event("Optimizer.step#RowSparseAdagrad.step", CUDA, device_us=900.0, annotation=True),
        _event("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", CUDA, device_us=3000.0),
        _event("_cell_grad_kernel", CUDA, device_us=1000.0),
        _event(
            "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
            CUDA,
            device_us=600.0,
        ),
        _event("cudnn::engines_precompiled::nchwToNhwcKernel", CUDA, device_us=400.0),
        _event(
            "void at::native::vectorized_elementwise_kernel<4, AddFunctor>", CUDA, device_us=200.0
        ),
        _event("cudaLaunchKernel", CPU, count=8),
        _event("cuLaunchKernel", CPU, count=2),
    ]
    profile = SimpleNamespace(key_averages=lambda: events)

    split = gpu_bilm.kernel_kinds(profile, steps=2)

    assert split == {
        "GEMM ms": 1.5,
        "Triton ms": 0.5,
        "copy ms": 0.5,
        "launches": 5.0,
        "pointwise ms": 0.1,
    }


def test_the_host_side_counts_each_op_by_its_own_time(gpu_bilm):
    """Where a step is host-bound, the host's ops by their own time: a kernel's device time is
    not the host's, and a parent op's time without its children's."""
    events = [
        _event("elmo::lstm_layer", CPU, cpu_us=4000.0),  # its Python: the Triton launches
        _event("aten::bmm", CPU, cpu_us=1000.0, count=80),
        _event("cudaLaunchKernel", CPU, cpu_us=2000.0, count=160),
        _event("_cell_kernel", CUDA, device_us=500.0, count=40),
    ]
    profile = SimpleNamespace(key_averages=lambda: events)

    host = gpu_bilm.host_ops(profile, steps=2)

    assert host == {
        "host ms": 3.5,
        "top host ops": [
            ["elmo::lstm_layer", 2.0, 1.0],
            ["cudaLaunchKernel", 1.0, 80.0],
            ["aten::bmm", 0.5, 40.0],
        ],
    }


def test_each_kernel_is_named_by_the_op_that_launched_it_and_its_shapes(gpu_bilm):
    """A pointwise kernel's template names no op: the launching op's own device time, grouped by
    its inputs' shapes, does (a region drawn over the device's timeline is not an op)."""
    events = [
        _event("aten::add_", CPU, device_us=3000.0, shapes=[[16000, 1024, 1, 15], [1024, 1, 1]]),
        _event("aten::add_", CPU, device_us=400.0, shapes=[[2560, 512], [512]]),
        _event("Optimizer.step#Adagrad.step", CPU, device_us=9000.0, annotation=True),
        _event("aten::max", CPU, cpu_us=50.0),  # no kernel of its own
        _event("void at::native::elementwise_kernel<128, 4>", CUDA, device_us=3400.0),
    ]
    grouped: list[bool] = []

    def key_averages(group_by_input_shape=False):
        grouped.append(group_by_input_shape)
        return events

    ops = gpu_bilm.device_ops(SimpleNamespace(key_averages=key_averages), steps=2)

    assert grouped == [True]
    assert ops == {
        "top device ops": [
            ["aten::add_", "[[16000, 1024, 1, 15], [1024, 1, 1]]", 1.5, 1.0],
            ["aten::add_", "[[2560, 512], [512]]", 0.2, 1.0],
        ]
    }


CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def _event(key, device_type, count=2, device_us=0.0, cpu_us=0.0, annotation=False, shapes=()):
    """One row of a profile's ``key_averages()``, as the summaries read it."""
    return SimpleNamespace(
        key=key,
        device_type=device_type,
        count=count,
        self_device_time_total=device_us,
        self_cpu_time_total=cpu_us,
        is_user_annotation=annotation,
        input_shapes=list(shapes),
    )
