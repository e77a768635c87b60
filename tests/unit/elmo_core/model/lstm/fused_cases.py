"""What the fused ops' tests share: one layer's inputs, windows run by a loop, an op counter."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.model.lstm.reference import LayerWeights

B, T, I, P, H = 4, 5, 3, 6, 8  # noqa: E741 (the input narrower than P: no transposition hides)
CELL_CLIP, PROJ_CLIP = 0.5, 0.3  # small: many cells and outputs clipped
VOCAB = 100  # more words than tiny's 64 sampled candidates


def _leaves(directions: int | None, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
    """One layer's parameters in their own layout (stacked over the directions when batched),
    large enough that the clips bite."""
    lead = () if directions is None else (directions,)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(4 * H, I), (4 * H, P), (1, 4 * H) if lead else (4 * H,), (P, H)]
    return [
        torch.randn(*lead, *shape, generator=generator).to(device).requires_grad_()
        for shape in shapes
    ]


def _weights(leaves: list[torch.Tensor]) -> LayerWeights:
    """As :meth:`ProjectedLSTMLayer.weights` gives them: the matrices as transposed views."""
    input_weight, recurrent, bias, projection = leaves
    return LayerWeights(input_weight.mT, recurrent.mT, bias, projection.mT)


def _mask(lengths: list[int], lead: tuple[int, ...]) -> torch.Tensor:
    return (torch.arange(T) < torch.tensor(lengths).unsqueeze(1)).expand(*lead, B, T)


def _two_windows(loop, directions: int | None, device: str = "cpu"):
    """Two windows, the second from the first's final state; a weighted loss over both windows'
    outputs and the final state -> outputs, final h and c, and the gradients of every input."""
    lead = () if directions is None else (directions,)
    leaves = _leaves(directions, device=device)
    generator = torch.Generator().manual_seed(1)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    windows = [draw(*lead, B, T, I).requires_grad_() for _ in "ab"]
    h0 = draw(*lead, B, P).requires_grad_()
    c0 = draw(*lead, B, H).requires_grad_()
    masks = [_mask(lengths, lead).to(device) for lengths in ([T, 2, 0, 1], [3, T, 1, 0])]
    output_scales = draw(2, *lead, B, T, P)
    h_scale = draw(*lead, B, P)
    c_scale = draw(*lead, B, H)
    h, c, outputs = h0, c0, []
    for window, mask in zip(windows, masks, strict=True):
        output, h, c = loop(window, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
        outputs.append(output)
    loss = sum((o * s).sum() for o, s in zip(outputs, output_scales, strict=True))
    loss = loss + (h * h_scale).sum() + (c * c_scale).sum()
    grads = torch.autograd.grad(loss, [*windows, h0, c0, *leaves])
    return outputs, h, c, grads, masks


def _carried_windows(
    loop, directions: int | None, clips=(CELL_CLIP, PROJ_CLIP), device: str = "cpu"
) -> list[torch.Tensor]:
    """Both windows' outputs and the final h and c of :func:`_two_windows`'s inputs, without
    gradients; batched directions get masks of their own, one with a gap inside a row."""
    lead = () if directions is None else (directions,)
    leaves = [leaf.detach() for leaf in _leaves(directions, device=device)]
    generator = torch.Generator().manual_seed(1)
    windows = [torch.randn(*lead, B, T, I, generator=generator).to(device) for _ in "ab"]
    h = torch.randn(*lead, B, P, generator=generator).to(device)
    c = torch.randn(*lead, B, H, generator=generator).to(device)
    masks = [_mask(lengths, lead).clone() for lengths in ([T, 2, 0, 1], [3, T, 1, 0])]
    if directions is not None:
        masks[0][1] = _mask([1, 0, T, 3], ())
        masks[1][1, 2, 3] = True  # a real token after padding
    outputs = []
    for window, mask in zip(windows, masks, strict=True):
        output, h, c = loop(window, mask.to(device), h, c, _weights(leaves), *clips)
        outputs.append(output)
    return [*outputs, h, c]


def _training_windows(width: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
    ]


class _Ops(TorchDispatchMode):
    """Counts the ops dispatched, those the fused layer's own ops run included: in eager mode on a
    GPU, each is about one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.elmo: list[str] = []  # the fused layer's own ops, by name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        kwargs = kwargs or {}
        if func.namespace == "elmo":  # run its implementation with this mode still counting
            self.elmo.append(func._opname)
            with self:
                cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
                return func.redispatch(cpu, *args, **kwargs)
        return func(*args, **kwargs)
