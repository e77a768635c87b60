import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from elmo_core.errors import ConfigError
from elmo_core.model import softmax as softmax_module
from elmo_core.model.sampler import LogUniformSampler, SampledCandidates, touched_rows
from elmo_core.model.softmax import SampledSoftmax


def _full_softmax_nll(softmax: SampledSoftmax, hidden: torch.Tensor, targets: torch.Tensor):
    logits = hidden @ softmax.weight.t() + softmax.bias
    return -F.log_softmax(logits, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)


def _softmax(num_classes=50, dim=8, num_samples=10, seed=0) -> SampledSoftmax:
    torch.manual_seed(seed)
    softmax = SampledSoftmax(num_classes, dim, num_samples)
    with torch.no_grad():
        softmax.bias.normal_()  # zero at init; make it matter in the tests
    return softmax


@pytest.mark.parametrize("num_samples", [0, 20, 21])
def test_num_samples_not_below_vocabulary_size_is_a_config_error(num_samples):
    with pytest.raises(ConfigError, match="model.num_samples"):
        SampledSoftmax(20, 4, num_samples)
    with pytest.raises(ConfigError, match="model.num_samples"):
        LogUniformSampler(20).sample_unique(num_samples)


def test_init_follows_bilm_tf():
    torch.manual_seed(0)
    softmax = SampledSoftmax(4000, 64, 100)
    assert softmax.weight.shape == (4000, 64) and softmax.bias.shape == (4000,)
    assert softmax.weight.std().item() == pytest.approx(1 / 8, rel=0.02)
    assert (softmax.bias == 0).all()


def test_sampled_loss_with_every_class_a_candidate_equals_the_full_softmax():
    softmax = _softmax(num_classes=12, dim=5)
    hidden = torch.randn(7, 5)
    targets = torch.tensor([0, 3, 11, 3, 5, 7, 1])
    everything = torch.arange(12)
    sampled = softmax.sampled_loss(
        hidden, targets, everything, torch.ones(7), torch.ones(12, dtype=torch.float64)
    )
    torch.testing.assert_close(sampled, _full_softmax_nll(softmax, hidden, targets))


def test_sampled_loss_hand_computed_with_log_q_correction_and_accidental_hit():
    softmax = SampledSoftmax(4, 2, 2)
    with torch.no_grad():
        softmax.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]))
        softmax.bias.copy_(torch.tensor([0.0, 0.5, 0.0, 0.0]))
    hidden = torch.tensor([[2.0, 1.0]])
    targets = torch.tensor([1])
    candidates = torch.tensor([1, 3])  # candidate 1 is the target: removed
    loss = softmax.sampled_loss(
        hidden, targets, candidates, torch.tensor([0.5]), torch.tensor([0.5, 0.25])
    )
    true_logit = 1.0 + 0.5 - math.log(0.5)
    other_logit = -2.0 - math.log(0.25)
    expected = math.log(math.exp(true_logit) + math.exp(other_logit)) - true_logit
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_training_forward_draws_candidates_and_is_reproducible_with_a_generator():
    softmax = _softmax(num_classes=200, dim=6, num_samples=20).train()
    hidden, targets = torch.randn(9, 6), torch.randint(0, 200, (9,))
    first = softmax(hidden, targets, torch.Generator().manual_seed(5))
    again = softmax(hidden, targets, torch.Generator().manual_seed(5))
    other = softmax(hidden, targets, torch.Generator().manual_seed(6))
    assert first.shape == (9,) and torch.isfinite(first).all() and (first > 0).all()
    torch.testing.assert_close(first, again)
    assert not torch.equal(first, other)


def test_candidates_drawn_ahead_give_the_loss_of_drawing_them_in_the_call():
    softmax = _softmax(num_classes=200, dim=6, num_samples=20).train()
    hidden, targets = torch.randn(9, 6), torch.randint(0, 200, (9,))
    drawn = softmax.sampler.sample_unique(20, torch.Generator().manual_seed(5))
    torch.testing.assert_close(
        softmax(hidden, targets, drawn=drawn),
        softmax(hidden, targets, torch.Generator().manual_seed(5)),
    )


def test_gradient_lands_only_on_candidate_and_target_rows():
    softmax = _softmax(num_classes=300, dim=4, num_samples=15).train()
    generator = torch.Generator().manual_seed(7)
    candidates, _ = softmax.sampler.sample_unique(15, torch.Generator().manual_seed(7))
    hidden, targets = torch.randn(5, 4), torch.tensor([250, 251, 252, 0, 250])
    softmax(hidden, targets, generator).sum().backward()
    touched = torch.zeros(300, dtype=torch.bool)
    touched[candidates] = True
    touched[targets] = True
    nonzero_rows = softmax.weight.grad.abs().sum(1) > 0
    assert torch.equal(nonzero_rows, touched)
    assert torch.equal(softmax.bias.grad != 0, touched)


@pytest.mark.parametrize("sparse", [False, True])
def test_rows_gathered_once_for_two_calls_equal_each_call_finding_its_own(sparse):
    softmax = _softmax(num_classes=300, dim=4, num_samples=15).train()
    softmax.sparse = sparse
    generator = torch.Generator().manual_seed(3)
    drawn = [softmax.sampler.sample_unique(15, generator) for _ in range(2)]
    hidden = torch.randn(2, 6, 4)
    targets = torch.randint(0, 300, (2, 6), generator=generator)

    def losses_and_grads(rows):
        softmax.zero_grad(set_to_none=True)
        total = sum(
            softmax(hidden[i], targets[i], drawn=drawn[i], rows=rows).sum() for i in range(2)
        )
        total.backward()
        return total.detach(), [p.grad.to_dense() for p in softmax.parameters()]

    each, each_grads = losses_and_grads(None)
    ids = touched_rows(targets.numpy(), *(d.ids.numpy() for d in drawn))
    once, once_grads = losses_and_grads(softmax.gather_rows(torch.from_numpy(ids)))
    torch.testing.assert_close(once, each)
    for a, b in zip(once_grads, each_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_rows_gathered_once_give_a_sparse_gradient_holding_each_of_them_once_in_order():
    softmax = _softmax(num_classes=100, dim=4, num_samples=3).train()
    softmax.sparse = True
    ids = torch.tensor([2, 5, 7, 40, 90])
    drawn = SampledCandidates(torch.tensor([5, 40, 7]), 4)
    hidden, targets = torch.randn(2, 4), torch.tensor([90, 2])
    softmax(hidden, targets, drawn=drawn, rows=softmax.gather_rows(ids)).sum().backward()
    sparse = [parameter.grad for parameter in softmax.parameters()]
    softmax.mark_rows_distinct()
    for grad in sparse:
        assert grad.is_sparse and grad.is_coalesced()  # nothing will sort them again
        assert grad.indices()[0].tolist() == ids.tolist()
    softmax.sparse = False
    softmax.zero_grad(set_to_none=True)
    softmax(hidden, targets, drawn=drawn).sum().backward()
    for grad, parameter in zip(sparse, softmax.parameters(), strict=True):
        torch.testing.assert_close(grad.to_dense(), parameter.grad)


def test_sparse_option_returns_a_row_sparse_weight_gradient():
    torch.manual_seed(0)
    softmax = SampledSoftmax(100, 4, 10, sparse=True).train()
    hidden, targets = torch.randn(3, 4), torch.tensor([90, 91, 92])
    softmax(hidden, targets, torch.Generator().manual_seed(0)).sum().backward()
    grad = softmax.weight.grad
    assert grad.is_sparse
    rows = set(grad.coalesce().indices()[0].tolist())
    candidates, _ = softmax.sampler.sample_unique(10, torch.Generator().manual_seed(0))
    assert rows == set(candidates.tolist()) | {90, 91, 92}


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 50, 1000])
def test_chunked_nll_equals_log_softmax(chunk_size):
    softmax = _softmax(num_classes=50, dim=8)
    hidden, targets = torch.randn(11, 8), torch.randint(0, 50, (11,))
    torch.testing.assert_close(
        softmax.nll(hidden, targets, chunk_size=chunk_size),
        _full_softmax_nll(softmax, hidden, targets),
    )


def test_eval_forward_is_the_full_softmax_and_does_not_sample():
    softmax = _softmax(num_classes=50, dim=8).eval()
    hidden, targets = torch.randn(4, 8), torch.randint(0, 50, (4,))
    state = torch.random.get_rng_state()
    loss = softmax(hidden, targets)
    assert torch.equal(state, torch.random.get_rng_state())
    torch.testing.assert_close(loss, _full_softmax_nll(softmax, hidden, targets))


def test_nll_accepts_bf16_hidden_and_accumulates_in_float32():
    softmax = _softmax(num_classes=50, dim=8)
    hidden, targets = torch.randn(6, 8), torch.randint(0, 50, (6,))
    low = softmax.nll(hidden.bfloat16(), targets, chunk_size=16)
    assert low.dtype == torch.float32
    exact = _full_softmax_nll(softmax, hidden.bfloat16().float(), targets)
    torch.testing.assert_close(low, exact)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = softmax.nll(hidden, targets, chunk_size=16)
    assert mixed.dtype == torch.float32 and (mixed >= 0).all()
    torch.testing.assert_close(
        mixed, _full_softmax_nll(softmax, hidden, targets), atol=0.1, rtol=0.05
    )


def _whole_logits_loss(softmax, hidden, targets, candidates, target_counts, candidate_counts):
    """The sampled loss as computed before issue 23: the whole (N, 1+K) logits at once."""
    hidden = hidden.to(softmax.weight.dtype)
    ids = torch.cat([targets, candidates])
    weights, biases = softmax.gather_rows(torch.unique(ids)).select(ids)
    n = targets.numel()
    target_logits = (hidden * weights[:n]).sum(-1).float()
    target_logits = target_logits + biases[:n].float() - target_counts.log().float()
    candidate_logits = (hidden @ weights[n:].t()).float()
    candidate_logits = candidate_logits + biases[n:].float() - candidate_counts.log().float()
    hits = targets.unsqueeze(1) == candidates.unsqueeze(0)
    candidate_logits = candidate_logits.masked_fill(hits, torch.finfo(torch.float32).min)
    logits = torch.cat([target_logits.unsqueeze(1), candidate_logits], dim=1)
    return torch.logsumexp(logits, dim=1) - target_logits


def _sampled_case(num_positions=37, num_classes=60, dim=6, num_samples=12, seed=0):
    """A softmax, hidden states, targets of which every third is a candidate (accidental hits),
    the candidates, their expected counts, and per-position loss weights (some zero)."""
    softmax = _softmax(num_classes, dim, num_samples, seed).train()
    generator = torch.Generator().manual_seed(seed)
    candidates, num_tries = softmax.sampler.sample_unique(num_samples, generator)
    targets = torch.randint(0, num_classes, (num_positions,), generator=generator)
    every_third = torch.arange(0, num_positions, 3)
    targets[every_third] = candidates[every_third % num_samples]
    counts = (
        softmax.sampler.expected_count(targets, num_tries),
        softmax.sampler.expected_count(candidates, num_tries),
    )
    hidden = 2 * torch.randn(num_positions, dim, generator=generator)
    scale = torch.rand(num_positions, generator=generator)
    scale[::4] = 0  # unscored positions
    return softmax, hidden, targets, candidates, counts, scale


def _loss_and_grads(softmax, hidden, scale, compute):
    softmax.zero_grad(set_to_none=True)
    hidden = hidden.clone().requires_grad_()
    loss = compute(hidden)
    (loss * scale).sum().backward()
    return [loss.detach(), hidden.grad] + [p.grad.to_dense() for p in softmax.parameters()]


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 37, 1000])
def test_chunked_sampled_loss_and_gradients_equal_the_whole_logits(chunk_size, sparse):
    softmax, hidden, targets, candidates, counts, scale = _sampled_case()
    softmax.sparse = sparse
    assert (targets.unsqueeze(1) == candidates).any(1).sum() >= 10  # accidental hits present
    chunked = _loss_and_grads(
        softmax,
        hidden,
        scale,
        lambda h: softmax.sampled_loss(h, targets, candidates, *counts, chunk_size=chunk_size),
    )
    whole = _loss_and_grads(
        softmax,
        hidden,
        scale,
        lambda h: _whole_logits_loss(softmax, h, targets, candidates, *counts),
    )
    assert chunked[0].dtype == torch.float32
    # float32 sums in another order: one-row chunks' products against one GEMM (on the device
    # machine's CPU, a weight gradient 7e-6 apart, relative)
    for got, expected in zip(chunked, whole, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert (chunked[2].abs().sum(1) > 0).sum() > 0  # the weight gradient is not all zero


@pytest.mark.parametrize("chunk_size", [1, 16, 1000])
def test_chunked_sampled_loss_under_bf16_autocast_follows_the_whole_logits(chunk_size):
    softmax, hidden, targets, candidates, counts, scale = _sampled_case()

    def chunked(h):
        return softmax.sampled_loss(h, targets, candidates, *counts, chunk_size=chunk_size)

    def whole(h):
        return _whole_logits_loss(softmax, h, targets, candidates, *counts)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = _loss_and_grads(softmax, hidden, scale, chunked)
        mixed_whole = _loss_and_grads(softmax, hidden, scale, whole)
    exact = _loss_and_grads(softmax, hidden, scale, chunked)
    assert mixed[0].dtype == torch.float32 and (mixed[0] >= 0).all()
    assert not torch.equal(mixed[0], exact[0])  # the GEMM did run in bf16
    # The same bf16 GEMMs: the loss and the hidden and bias gradients match closely; the
    # candidate rows' gradient sums per-chunk bf16 products in float32 (one bf16 product before).
    (loss, grad_hidden, grad_weight, grad_bias), expected = mixed, mixed_whole
    torch.testing.assert_close(loss, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_hidden, expected[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_weight, expected[2], rtol=0.02, atol=0.03)
    torch.testing.assert_close(grad_bias, expected[3], rtol=1e-5, atol=1e-5)
    for got, expected in zip(mixed, exact, strict=True):
        torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)


class _LargestOutput(TorchDispatchMode):
    """Records the most elements any op's output has, backward included."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.numel())
        return out


@pytest.mark.parametrize("sparse", [False, True])
def test_chunked_sampled_loss_never_holds_the_whole_logits(sparse):
    num_positions, num_samples, chunk_size = 64, 48, 16
    softmax, hidden, targets, candidates, counts, scale = _sampled_case(
        num_positions, num_classes=100, dim=4, num_samples=num_samples
    )
    softmax.sparse = sparse
    whole_logits = num_positions * num_samples  # (N, K): less than the (N, 1+K) of the logits

    def probe(compute):
        saved = []

        def pack(tensor):
            saved.append(tensor.numel())
            return tensor

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        with _LargestOutput() as largest, hooks:
            _loss_and_grads(softmax, hidden, scale, compute)
        return largest.largest, max(saved)

    largest, largest_saved = probe(
        lambda h: softmax.sampled_loss(h, targets, candidates, *counts, chunk_size=chunk_size)
    )
    assert largest <= chunk_size * (num_samples + 1) < whole_logits
    assert largest_saved < whole_logits
    # The probe sees the whole logits where they exist.
    largest, largest_saved = probe(
        lambda h: _whole_logits_loss(softmax, h, targets, candidates, *counts)
    )
    assert largest >= num_positions * (num_samples + 1) and largest_saved >= whole_logits


class _Launches(TorchDispatchMode):
    """Counts the ops that would launch a kernel on a GPU: every op but views."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


# A chunk's own launches: its candidate logits (GEMM, offsets, hit mask, fill), then forward
# logsumexp and logaddexp; backward the logits again, softmax (3 in place), the hidden rows'
# GEMM and add, the candidate rows' GEMM, the bias sum, and their accumulation.
CHUNK_LAUNCHES = 6 + 4 + 3 + 2 + 2 + 1


def test_a_chunk_of_the_sampled_loss_adds_a_fixed_handful_of_launches():
    def launches(num_positions: int, chunks: int) -> int:
        softmax, hidden, targets, candidates, counts, scale = _sampled_case(num_positions)

        def loss(h):
            chunk_size = num_positions // chunks
            return softmax.sampled_loss(h, targets, candidates, *counts, chunk_size=chunk_size)

        with _Launches() as mode:
            _loss_and_grads(softmax, hidden, scale, loss)
        return mode.count

    one, two, four = (launches(32, chunks) for chunks in (1, 2, 4))
    assert 0 < two - one <= CHUNK_LAUNCHES
    assert four - two == 2 * (two - one)  # every chunk after the first the same
    assert launches(64, 1) == one  # what is not chunked runs once, whatever the positions


def _compiled_against_eager(device: str, bf16: bool, monkeypatch) -> None:
    """Two chunks of one shape (one compile per epilogue and dtype), accidental hits and unscored
    positions among them: the compiled epilogues give the eager loss and every gradient."""
    softmax, hidden, targets, candidates, counts, scale = _sampled_case(num_positions=32)
    softmax, hidden, scale = softmax.to(device), hidden.to(device), scale.to(device)
    targets, candidates = targets.to(device), candidates.to(device)
    counts = tuple(count.to(device) for count in counts)

    def run(compiled: bool):
        monkeypatch.setattr(softmax_module, "compile_epilogues", lambda hidden: compiled)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            return _loss_and_grads(
                softmax,
                hidden,
                scale,
                lambda h: softmax.sampled_loss(h, targets, candidates, *counts, chunk_size=16),
            )

    graphs = counters["stats"]["unique_graphs"]
    eager, compiled = run(False), run(True)
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled epilogues ran
    names = ["loss", "hidden", "weight", "bias"]
    for got, expected, name in zip(compiled, eager, names, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=name)
    assert compiled[2].abs().sum() > 0


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "autocast"])
def test_compiled_chunk_epilogues_give_the_eager_loss_and_gradients(bf16, monkeypatch):
    _compiled_against_eager("cpu", bf16, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "autocast"])
def test_on_cuda_the_compiled_chunk_epilogues_give_the_eager_loss_and_gradients(bf16, monkeypatch):
    _compiled_against_eager("cuda", bf16, monkeypatch)
