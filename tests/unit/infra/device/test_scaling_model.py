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
    assert one == (0.0, 0.0, 0.0) and scaling_model.efficiency(0.02, *one) == (1.0, 1.0)
    two_nodes = scaling_model.Cluster(8, 2)
    fast = scaling_model.efficiency(0.02, *scaling_model.exchange_seconds(10**9, 10**7, two_nodes))
    monkeypatch.setattr(scaling_model, "NETWORK", scaling_model.NETWORK / 4)
    slow = scaling_model.efficiency(0.02, *scaling_model.exchange_seconds(10**9, 10**7, two_nodes))
    assert slow[0] < fast[0] < 1 and slow[1] < fast[1] <= 1
    assert fast[0] <= fast[1]  # hiding the all-reduce behind the backward never costs


def test_summing_the_gathered_rows_grows_with_the_workers_and_costs_efficiency() -> None:
    node, two_nodes = scaling_model.Cluster(8, 1), scaling_model.Cluster(8, 2)
    union_node = scaling_model.exchange_seconds(10**9, 10**7, node)[2]
    union_two = scaling_model.exchange_seconds(10**9, 10**7, two_nodes)[2]
    assert union_two == pytest.approx(2 * union_node) and union_node > 0
    without = scaling_model.efficiency(0.02, 0.001, 0.002, 0.0)
    assert scaling_model.efficiency(0.02, 0.001, 0.002, union_two) < without
