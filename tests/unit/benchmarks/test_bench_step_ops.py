import pytest
import torch

VARIANTS = ("reference_apart", "reference_batched", "fused_batched")


@pytest.fixture
def bench_step_ops():
    from benchmarks import bench_step_ops

    return bench_step_ops


def test_a_custom_op_is_one_launch_and_its_inside_ops_are_counted_apart(bench_step_ops):
    from elmo_core.model.lstm.fused import fused_layer
    from elmo_core.model.lstm.reference import LayerWeights

    rows, window, width, cells = 2, 3, 4, 8
    weights = LayerWeights(
        torch.randn(width, 4 * cells),
        torch.randn(width, 4 * cells),
        torch.zeros(4 * cells),
        torch.randn(cells, width),
    )
    with bench_step_ops.Launches() as launches:
        fused_layer(
            torch.randn(rows, window, width, requires_grad=True),  # the training op
            torch.ones(rows, window, dtype=torch.bool),
            torch.zeros(rows, width),
            torch.zeros(rows, cells),
            weights,
            None,
            None,
        )
    assert launches.custom == {"elmo::lstm_layer": 1}
    assert launches.ops == launches.aten + 1 and launches.inside.count > window
    assert launches.total == launches.ops - launches.views


def test_prediction_takes_the_slower_of_launches_and_flops(bench_step_ops):
    args = bench_step_ops.argparse.Namespace(launch_us=5.0, peak_tflops=800.0, efficiency=0.5)
    # 1,000 launches: 5 ms; 2,560 positions of 1 GFLOP at 400 TFLOP/s: 6.4 ms
    rate, bound = bench_step_ops.predicted_positions_per_s(1_000, 1e9, 2_560, args)
    assert bound == "FLOP" and rate == pytest.approx(2_560 / 6.4e-3)
    rate, bound = bench_step_ops.predicted_positions_per_s(10_000, 1e9, 2_560, args)
    assert bound == "launch" and rate == pytest.approx(2_560 / 50e-3)


def test_every_launch_of_a_step_falls_in_one_phase(bench_step_ops):
    launches = bench_step_ops.count_step("tiny", "fused_batched", 4, 5, 200, 50, "meta")
    assert set(launches.by_phase) == set(bench_step_ops.PHASES)
    assert sum(launches.by_phase.values()) == launches.total
    assert all(count > 0 for count in launches.by_phase.values())


def test_the_clip_and_adagrad_launch_alike_for_4_and_40_parameters(bench_step_ops):
    """Multi-tensor ops: a parameter more is no launch more (the softmax's sparse rows included)."""
    from elmo_core.training.gradient_exchange import clip_global_norm
    from elmo_core.training.row_adagrad import RowSparseAdagrad

    def launches(num_dense: int) -> int:
        parameters = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(num_dense)]
        for parameter in parameters:
            parameter.grad = torch.randn(3, 2)
        rows = torch.tensor([1, 4, 6])
        for shape in ((10, 4), (10,)):  # the softmax's weight and bias, with row gradients
            parameters.append(torch.nn.Parameter(torch.randn(shape)))
            parameters[-1].grad = torch.sparse_coo_tensor(
                rows.unsqueeze(0), torch.randn(3, *shape[1:]), shape, is_coalesced=True
            )
        optimizer = RowSparseAdagrad(parameters, lr=0.1, initial_accumulator_value=0.1)
        with bench_step_ops.Launches() as counted:
            clip_global_norm(parameters, 0.5)
            optimizer.step()
        return counted.total

    assert launches(4) == launches(40)
