"""The whole training step as one CUDA graph per shape: ``train.capture_step``.

At small batches a step waits on the host, which launches its hundreds of kernels one by one
(figures: benchmarks/results/gpu_graphed-2026-11-27.md). Captured, a step is a few
copies into the graph's inputs and one replay. The loader's shape buckets keep the shapes to a
few; each new one runs eagerly :data:`WARMUP_STEPS` times (lazy state, compiles, Triton's
launchers), is captured at the next, and replayed from then on. Every graph shares one memory
pool: a replay's outputs are copied out before the next replay can reuse the pool.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from elmo_core.model.lstm.graphed import whole_step_captured

WARMUP_STEPS = 2  # eager steps of each new shape before it is captured
logger = logging.getLogger(__name__)
Result = TypeVar("Result")
Value = TypeVar("Value")


def shape_key(arguments: dict[str, Any], *settings: Hashable) -> Hashable:
    """What a graph of the step bakes in: the arguments' structure, each tensor's shape, dtype
    and device, each other value itself (a Python number is a constant of the graph), and the
    caller's ``settings`` (the learning rate)."""
    leaves, spec = tree_flatten(arguments)
    described = tuple(
        (tuple(leaf.shape), leaf.dtype, leaf.device) if isinstance(leaf, torch.Tensor) else leaf
        for leaf in leaves
    )
    return str(spec), described, settings


class _Graph:
    """One captured step: its static inputs on the device, the graph, and its static outputs."""

    def __init__(
        self,
        run: Callable[[dict[str, Any]], Any],
        arguments: dict[str, Any],
        stream: torch.cuda.Stream,
        pool: Any,
    ) -> None:
        device = torch.device("cuda", torch.cuda.current_device())
        # outside the pool: every replay reads them; host tensors (the draw counts) move to the
        # device, so no replay copies from host memory that the next step's batch overwrites
        self.inputs = tree_map(
            lambda leaf: leaf.to(device, copy=True) if isinstance(leaf, torch.Tensor) else leaf,
            arguments,
        )
        self.statics = tree_flatten(self.inputs)[0]  # in the order a call's leaves flatten
        self.graph = torch.cuda.CUDAGraph()
        capture = torch.cuda.graph(
            self.graph, pool=pool, stream=stream, capture_error_mode="thread_local"
        )  # other threads (a loader pinning memory) may call CUDA meanwhile
        with whole_step_captured(), capture:
            self.outputs = run(self.inputs)

    def replay(self, arguments: dict[str, Any]) -> Any:
        """The step on ``arguments`` (shaped as those captured); its results copied out."""
        for static, leaf in zip(self.statics, tree_flatten(arguments)[0], strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(leaf, non_blocking=True)
        self.graph.replay()
        leaves, spec = tree_flatten(self.outputs)
        copied = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        return tree_unflatten(copied, spec)


class StepGraphs:
    """A step function's graphs by :func:`shape_key`, made as each shape comes up.

    A shape whose capture fails (an op that cannot be captured) is logged with the error and runs
    eagerly from then on: the run goes on, slower. ``forget_partial`` is called first, to drop
    what the failed capture left behind (the gradients it began).
    """

    def __init__(
        self, forget_partial: Callable[[], None], warmup_steps: int = WARMUP_STEPS
    ) -> None:
        self.forget_partial, self.warmup_steps = forget_partial, warmup_steps
        self.graphs: dict[Hashable, _Graph] = {}
        self.seen: Counter[Hashable] = Counter()
        self.eager: set[Hashable] = set()  # shapes whose capture failed
        self.replays = 0  # steps run as a replay
        self.stream = torch.cuda.Stream()  # warm-ups and captures: not the caller's stream
        self.pool = torch.cuda.graph_pool_handle()

    def clear(self) -> None:
        """Forget the graphs: they hold the optimiser state's tensors, which a load replaces."""
        torch.cuda.synchronize()  # no replay still reads their inputs
        self.graphs.clear()
        self.seen.clear()
        self.eager.clear()

    def __call__(
        self, run: Callable[[dict[str, Any]], Result], arguments: dict[str, Any], key: Hashable
    ) -> Result:
        """``run(arguments)``: eagerly while its shape is new, then replayed."""
        graph = self.graphs.get(key)
        if graph is None:
            self.seen[key] += 1
            if self.seen[key] <= self.warmup_steps or key in self.eager:
                return self._on_own_stream(lambda: self._eager(run, arguments))
            started = time.perf_counter()
            try:
                graph = self._on_own_stream(lambda: _Graph(run, arguments, self.stream, self.pool))
            except RuntimeError as error:  # what torch raises for an op a capture refuses
                logger.warning(
                    "the training step's shape %d could not be captured as a CUDA graph; it "
                    "runs eagerly: %s",
                    len(self.graphs) + len(self.eager) + 1,
                    error,
                )
                self.eager.add(key)
                self.forget_partial()
                return self._on_own_stream(lambda: self._eager(run, arguments))
            self.graphs[key] = graph
            logger.info(
                "captured the training step's shape %d as one CUDA graph in %.1f s (%d replays "
                "of the earlier shapes)",
                len(self.graphs),
                time.perf_counter() - started,
                self.replays,
            )
        self.replays += 1
        return graph.replay(arguments)

    @staticmethod
    def _eager(run: Callable[[dict[str, Any]], Result], arguments: dict[str, Any]) -> Result:
        with whole_step_captured():  # the same ops the capture will record
            return run(arguments)

    def _on_own_stream(self, work: Callable[[], Value]) -> Value:
        """``work()`` on the graphs' stream, ordered after the caller's work and before its next."""
        caller = torch.cuda.current_stream()
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            value = work()
        caller.wait_stream(self.stream)
        return value
