"""The data-parallel scaling model: the bytes it counts and the efficiencies it predicts."""

import pytest

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from infra.device import scaling_model


def test_the_dense_gradients_are_every_parameter_but_the_softmax() -> None:
    bilm = BiLM(tiny(), scaling_model.VOCAB)
    assert bilm.softmax is not None
    softmax = sum(p.numel() for p in bilm.softmax.parameters())
    expected = 4 * (sum(p.numel() for p in bilm.parameters()) - softmax)
    assert scaling_model.dense_bytes("tiny") == expected


def test_the_rows_sent_are_the_static_bound_the_step_pads_to() -> None:
    config = tiny()
    bound = 2 * 8 * scaling_model.WINDOW + 2 * config.num_samples  # under tiny's vocabulary
    row = (config.lstm.projection_dim + 1) * 4 + 8
    assert scaling_model.sparse_bytes("tiny", 8) == bound * row


def test_one_gpu_exchanges_nothing_and_a_slower_network_scales_worse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = scaling_model.exchange_seconds(10**9, 10**7, scaling_model.Cluster(1, 1))
    assert one == (0.0, 0.0, 0.0)
    assert scaling_model.efficiency(0.02, 0.0, scaling_model.Cost(0.0)) == (1.0, 1.0)
    two_nodes = scaling_model.Cluster(8, 2)

    def predicted() -> tuple[float, float]:
        dense, gather, summing = scaling_model.exchange_seconds(10**9, 10**7, two_nodes)
        return scaling_model.efficiency(0.02, dense, scaling_model.Cost(gather, summing))

    fast = predicted()
    monkeypatch.setattr(scaling_model, "NETWORK", scaling_model.NETWORK / 4)
    slow = predicted()
    assert slow[0] < fast[0] < 1 and slow[1] < fast[1] <= 1
    assert fast[0] <= fast[1]  # hiding the all-reduce behind the backward never costs


def test_summing_the_gathered_rows_grows_with_the_workers_and_costs_efficiency() -> None:
    node, two_nodes = scaling_model.Cluster(8, 1), scaling_model.Cluster(8, 2)
    summing_node = scaling_model.exchange_seconds(10**9, 10**7, node)[2]
    summing_two = scaling_model.exchange_seconds(10**9, 10**7, two_nodes)[2]
    assert summing_two == pytest.approx(2 * summing_node) and summing_node > 0
    without = scaling_model.efficiency(0.02, 0.001, scaling_model.Cost(0.002))
    assert scaling_model.efficiency(0.02, 0.001, scaling_model.Cost(0.002, summing_two)) < without


def test_an_exchange_launched_from_the_softmax_gradients_hides_behind_the_backward() -> None:
    serial = scaling_model.efficiency(0.06, 0.003, scaling_model.Cost(0.005))
    hidden = scaling_model.efficiency(0.06, 0.003, scaling_model.Cost(0.005, overlapped=True))
    assert serial[0] == hidden[0] < serial[1] < hidden[1] == 1.0
    too_long = scaling_model.efficiency(0.06, 0.003, scaling_model.Cost(0.05, overlapped=True))
    assert too_long[1] < 1.0  # past the backward after the softmax, it shows


def test_the_built_design_meets_the_goal_in_the_model_and_the_gather_did_not() -> None:
    step_s = 1024 * scaling_model.WINDOW / scaling_model.MEASURED_POSITIONS_PER_S["h100"][1024]
    dense = scaling_model.dense_bytes("original")
    for cluster, goal in ((scaling_model.Cluster(8, 2), 0.90), (scaling_model.Cluster(8, 1), 0.95)):
        dense_s = scaling_model.all_reduce_seconds(dense, cluster)
        costs = scaling_model.designs("original", 1024, cluster)
        built = costs["union all-reduce, overlapped (built)"]
        assert scaling_model.efficiency(step_s, dense_s, built)[1] >= goal
        after = scaling_model.efficiency(step_s, dense_s, costs["union all-reduce, after"])[1]
        before = scaling_model.efficiency(step_s, dense_s, costs["gather (before)"])[1]
        assert before < goal <= after  # even with its rows sent after the backward


def test_a_size_without_measured_inputs_is_refused_and_a_given_rate_is_used(capsys) -> None:
    with pytest.raises(SystemExit):
        scaling_model.main(["--rows", "256"])
    assert "--rows 256: the model has a measured step rate and rows touched for 128, 1024" in (
        capsys.readouterr().err
    )
    assert scaling_model.main(["--rows", "128", "--positions-per-s", "128=256000"]) == 0
    printed = capsys.readouterr().out
    assert "128 rows: step 10.0 ms" in printed  # 128 × 20 positions at 256k/s
