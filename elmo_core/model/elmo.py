"""ELMo: task-specific scalar mixes of a (usually frozen) biLM's layers (Peters et al. 2018, §3.2).

Follows AllenNLP's ``Elmo``, except that, as bilm-tf's ``weight_layers`` does, the boundary
positions are stripped *before* the mix, so the optional layer norm sees the real tokens only.

Shapes: B rows, T tokens, W chars per token, P projection, L LSTM layers, R representations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from elmo_core.config import ModelConfig
from elmo_core.model.scalar_mix import ScalarMix
from elmo_core.text.char_ids import batch_to_ids


def remove_sentence_boundaries(
    tensor: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop ``<S>`` (position 0) and each row's ``</S>`` (its last real position).

    ``tensor (B, T+2, D)``, ``mask (B, T+2)`` with every row's real positions first →
    ``(B, T, D)`` with padding zeroed, and ``mask (B, T)``. Output position ``t`` is input
    ``t + 1``; it is a real token iff input ``t + 2`` is real (``</S>`` sits at ``length − 1``).
    """
    new_mask = mask[:, 2:].bool()  # (B, T)
    stripped = tensor[:, 1:-1] * new_mask.unsqueeze(-1).to(tensor.dtype)  # (B, T, D)
    return stripped, new_mask


def bilm_layers(bilm: nn.Module, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
    """Every layer of a frozen biLM for a batch of token lists, boundary tokens stripped:
    ``(N, L, T, 2P)``, zero on padding. Stateless, so a sentence's rows do not depend on its
    batch (what the pyfunc model and ``elmo embed`` both serve)."""
    device = next(bilm.parameters()).device
    char_ids = batch_to_ids([list(tokens) for tokens in sentences]).to(device)  # (N, T, W)
    with torch.inference_mode():
        output = bilm(char_ids)
    activations, mask = output.activations, output.mask  # L × (N, T+2, 2P), (N, T+2)
    stripped = [remove_sentence_boundaries(layer, mask)[0] for layer in activations]
    return torch.stack(stripped, dim=1)  # (N, L, T, 2P)


class Elmo(nn.Module):
    """``num_output_representations`` ELMo vectors per token from one biLM.

    ``bilm`` is any module with the :class:`~elmo_core.model.bilm.BiLM` contract —
    ``forward(char_ids (B, T, W))`` returning a :class:`~elmo_core.model.bilm.BiLMOutput` with
    ``activations`` L + 1 × (B, T+2, 2P) and ``mask`` (B, T+2) — and a ``config``
    (:class:`~elmo_core.config.ModelConfig`). Unless ``requires_grad``, the biLM
    is frozen: its parameters take no gradient and it runs in eval mode under ``no_grad``.
    ``scalar_mix_parameters`` fixes every mix's (unnormalised) weights instead of learning them.
    """

    def __init__(
        self,
        bilm: nn.Module,
        num_output_representations: int,
        dropout: float = 0.5,
        do_layer_norm: bool = False,
        keep_sentence_boundaries: bool = False,
        requires_grad: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.bilm = bilm
        config = cast(ModelConfig, bilm.config)
        self.num_layers = config.lstm.num_layers + 1  # [x; x] and one per LSTM layer
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.requires_grad = requires_grad
        self.bilm.requires_grad_(requires_grad)
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(
                self.num_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=scalar_mix_parameters is None,
            )
            for _ in range(num_output_representations)
        )
        self.dropout = nn.Dropout(dropout)
        self.train(self.training)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, num_output_representations: int, **kwargs: Any
    ) -> Elmo:
        """ELMo over one of our biLMs: a model, training checkpoint or training run directory."""
        from elmo_core.model.serialization import find_model_dir, read_bilm_dir

        return cls(read_bilm_dir(find_model_dir(Path(path))), num_output_representations, **kwargs)

    def train(self, mode: bool = True) -> Elmo:
        """As ``nn.Module.train``, but a frozen biLM stays in eval mode (no LSTM dropout)."""
        super().train(mode)
        if not self.requires_grad:
            self.bilm.eval()
        return self

    def forward(self, char_ids: torch.Tensor) -> dict[str, Any]:
        """``char_ids (B, T, W)`` → ``elmo_representations``: R × (B, T, 2P), ``mask`` (B, T).

        With ``keep_sentence_boundaries`` the shapes are (B, T+2, 2P) and (B, T+2).
        """
        frozen = contextlib.nullcontext() if self.requires_grad else torch.no_grad()
        with frozen:
            output = self.bilm(char_ids)
        layers, mask = output.activations, output.mask  # L+1 × (B, T+2, 2P), (B, T+2)
        if not self.keep_sentence_boundaries:
            stripped = [remove_sentence_boundaries(layer, mask) for layer in layers]
            layers = [layer for layer, _ in stripped]  # L+1 × (B, T, 2P)
            mask = stripped[0][1]  # (B, T)
        representations = [self.dropout(mix(layers, mask)) for mix in self.scalar_mixes]
        return {"elmo_representations": representations, "mask": mask}
