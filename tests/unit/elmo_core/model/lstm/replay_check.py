"""A CPU stand-in for cudagraph trees' overwrite rule, so a CPU test fails where a GPU would.

Under ``mode="reduce-overhead"`` a call that starts a new generation (no backward pending: grad
off, or the first call after a backward) replays over the previous generation's outputs, and a
later read of one raises. On CPU the compiled loop returns ordinary tensors, so the read passes
unnoticed; within :func:`emulate_graph_replays` it raises as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from elmo_core.model.lstm import fused as lstm_fused
from elmo_core.model.lstm import graphed as lstm_graphed
from elmo_core.model.lstm.reference import LayerLoop

OVERWRITTEN = "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"


class _GraphReplays(TorchDispatchMode):
    """Fails every op that reads an overwritten output (shares its storage). Those outputs are
    kept alive, so no later tensor is allocated at their addresses."""

    def __init__(self) -> None:
        super().__init__()
        self.generation: list[torch.Tensor] = []  # the outputs of the current generation
        self.overwritten: dict[int, torch.Tensor] = {}  # storage address -> output
        self.backward_pending = False

    def outside(self, loop: LayerLoop, graphed: bool) -> LayerLoop:
        """``loop`` run outside this mode (Dynamo will not trace under it), its inputs checked
        here instead; if ``graphed``, its calls overwrite as cudagraph trees' do."""

        def run(*args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self.check(args, loop)
            if graphed and not self.backward_pending:  # a new generation
                self.overwritten |= {_address(output): output for output in self.generation}
                self.generation = []
            with _disable_current_modes():
                outputs = loop(*args)
            if graphed:
                self.generation.extend(outputs)
                if (grad_fn := outputs[0].grad_fn) is not None:
                    self.backward_pending = True
                    grad_fn.register_hook(self._backward_ran)
            return outputs

        return run

    def check(self, inputs: Any, func: object) -> None:
        for leaf in tree_leaves(inputs):
            if isinstance(leaf, torch.Tensor) and _address(leaf) in self.overwritten:
                raise RuntimeError(f"{OVERWRITTEN} (emulated by replay_check, reading in {func})")

    def _backward_ran(self, *_: Any) -> None:
        self.backward_pending = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.check((args, kwargs), func)
        return func(*args, **(kwargs or {}))


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


@contextlib.contextmanager
def emulate_graph_replays() -> Iterator[None]:
    """Within: the graphed loop's outputs are overwritten as on a GPU, and reads fail; the plain
    fused loop's inputs are checked too."""
    loops = (lstm_fused.fused_layer, lstm_graphed.graphed_layer)
    replays = _GraphReplays()
    graphed = replays.outside(lstm_graphed.graphed_layer(), graphed=True)
    lstm_fused.fused_layer = replays.outside(loops[0], graphed=False)  # type: ignore[assignment]
    lstm_graphed.graphed_layer = lambda: graphed  # type: ignore[assignment]
    try:
        with replays:
            yield
    finally:
        lstm_fused.fused_layer, lstm_graphed.graphed_layer = loops  # type: ignore[assignment]
