"""The projected LSTM's variants and the one table of which runs where, :data:`CHOICES`.

Every variant keeps :class:`~.reference.ProjectedLSTM`'s parameters and passes its parity tests;
a device's choice is the fastest that does (figures: benchmarks/results/).

| variant   | CPU                                | CUDA                                         |
| fused     | chosen: fastest to embed and train | runs; what graphed runs where grad is off    |
| cudnn     | runs, no clips; slower than fused  | chosen where no clips and directions apart   |
| reference | runs: the parity baseline          | runs                                         |
| compiled  | runs (Inductor's CPU backend)      | runs, one compile per shape                  |
| graphed   | runs as fused, compiled            | chosen, directions batched: fused's ops      |
|           |                                    | replayed as CUDA graphs while training       |
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, NamedTuple, cast, get_args

if TYPE_CHECKING:
    from elmo_core.config import ModelConfig
    from elmo_core.model.lstm.reference import ProjectedLSTM

logger = logging.getLogger(__name__)

Variant = Literal["reference", "cudnn", "compiled", "graphed", "fused"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)
Device = Literal["cpu", "cuda"]


class Choice(NamedTuple):
    """What runs on a device where the config names no variant."""

    lstm_impl: Variant  # what ``auto`` runs
    batch_directions: bool  # whether a training run here batches the directions by default
    unclipped: Variant  # what ``auto`` runs where both clips are null and the directions apart


CHOICES: dict[Device, Choice] = {
    # measured: benchmarks/results/bench_inference-2026-11-26.md, bench_cpu_step-2026-11-25.md
    # (batched directions gain nothing on a CPU), lstm_dispatch-2026-11-27.md (cudnn)
    "cpu": Choice("fused", batch_directions=False, unclipped="fused"),
    # measured on an H200: graphed ahead of fused at 128 rows, where the step waits for the
    # host, and even at 1,024 (gpu_graphed-2026-11-27.md); fused with batched directions ahead
    # of the reference loop (gpu_bf16_backward-2026-11-27.md); cuDNN, predicted: one kernel a
    # layer
    "cuda": Choice("graphed", batch_directions=True, unclipped="cudnn"),
}


def current_device() -> Device:
    """Where a model built now runs: models are built on the CPU, then moved to CUDA if any."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve(config: ModelConfig, device: Device | None = None) -> Variant:
    """The variant that runs ``config`` on ``device`` (by default :func:`current_device`): the
    one ``model.lstm_impl`` names, or for ``auto`` the device's choice."""
    if config.lstm_impl != "auto":
        return cast(Variant, config.lstm_impl)
    choice = CHOICES[device or current_device()]
    unclipped = config.lstm.cell_clip is None and config.lstm.proj_clip is None
    return choice.unclipped if unclipped and not config.batch_directions else choice.lstm_impl


def implementation(variant: Variant) -> type[ProjectedLSTM]:
    """The class of ``variant``, its module imported here: the table above is read where torch
    is not imported (a training run's config is resolved on the driver)."""
    match variant:
        case "reference":
            from elmo_core.model.lstm.reference import ProjectedLSTM

            return ProjectedLSTM
        case "cudnn":
            from elmo_core.model.lstm.cudnn import CudnnProjectedLSTM

            return CudnnProjectedLSTM
        case "compiled":
            from elmo_core.model.lstm.compiled import CompiledProjectedLSTM

            return CompiledProjectedLSTM
        case "graphed":
            from elmo_core.model.lstm.graphed import GraphedProjectedLSTM

            return GraphedProjectedLSTM
        case "fused":
            from elmo_core.model.lstm.fused import FusedProjectedLSTM

            return FusedProjectedLSTM


def build_lstm(config: ModelConfig, input_dim: int) -> ProjectedLSTM:
    """One direction's stack, of the variant that runs ``config`` here."""
    return implementation(resolve(config))(config.lstm, input_dim, config.dropout)


def training_defaults(device: Device) -> dict[str, Variant | bool]:
    """The ``model`` keys a training run on ``device`` takes where the user set none."""
    choice = CHOICES[device]
    return {"lstm_impl": choice.lstm_impl, "batch_directions": choice.batch_directions}


def for_loading(config: ModelConfig, source: object) -> ModelConfig:
    """``config`` as a model loaded from ``source`` runs here: ``auto`` stays (it resolves to this
    device's choice); a variant the file names that is not this device's choice gives way to it,
    logged. Every variant has the same parameters, so the weights load either way."""
    device = current_device()
    chosen = resolve(config.model_copy(update={"lstm_impl": "auto"}), device)
    if config.lstm_impl in ("auto", chosen):
        return config
    logger.warning(
        "%s was saved to run the %s LSTM; it runs %s, the fastest variant that passes parity "
        "on %s (elmo_core.model.lstm.CHOICES)",
        source,
        config.lstm_impl,
        chosen,
        device,
    )
    return config.model_copy(update={"lstm_impl": chosen})
