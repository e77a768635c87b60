"""The bidirectional language model: char-CNN token encoder, two projected LSTM stacks, softmax.

``forward`` gives ELMo's layers, stateless by default so a sentence always gives the same vectors;
``score_window`` runs the language model on two streams of windows with the state carried by the
caller, so training and perplexity share one per-direction forward
(docs/architecture.md, "The model, exactly").

Shape legend: B rows, T window, W chars per token, P projection, H cell, L layers, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
from torch import nn

from elmo_core.config import ModelConfig
from elmo_core.errors import ConfigError
from elmo_core.model.char_cnn import CharCNN, TokenTypes
from elmo_core.model.lstm import build_lstm
from elmo_core.model.lstm.directions import run_both_directions
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.model.sampler import SampledCandidates
from elmo_core.model.softmax import SampledSoftmax, SoftmaxRows
from elmo_core.text.char_ids import BOS_IDS, EOS_IDS

BiLMState = tuple[LSTMState, LSTMState]  # (forward stack, backward stack)
# The warm start's buffers: not in the state dict (a bilm-tf file has none), moved with the model.
START_STATE_BUFFERS = ("start_forward_h", "start_forward_c", "start_backward_h", "start_backward_c")
Score = TypeVar("Score")  # what a scoring function makes of one direction's window


class BiLMOutput(NamedTuple):
    """What ``BiLM.forward`` returns: the layers ELMo mixes, where they are real, the new state."""

    activations: list[torch.Tensor]  # L + 1 × (B, T + 2, 2P): [x; x], then [f_k; b_k]
    mask: torch.Tensor  # (B, T + 2) bool: real tokens and their markers
    state: BiLMState  # (forward, backward) stacks after this call


class DirectionOutput(NamedTuple):
    """One direction's top layer over a stream window, as the softmax sees it."""

    top: torch.Tensor  # (B, T, P): the last layer's output after the top dropout
    mask: torch.Tensor  # (B, T) bool: real tokens (an all-zero token is padding)

    def scored(self, targets: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` positions whose target counts: a real token with a non-negative target."""
        return (targets >= 0) & self.mask


class LossOutput(NamedTuple):
    """Mean per-direction losses of a window; the objective is ``loss = ½(forward + backward)``.

    ``num_tokens`` counts the scored positions of the forward stream (a window's token positions;
    the backward stream holds the same tokens reversed).
    """

    forward: torch.Tensor
    backward: torch.Tensor
    num_tokens: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        return 0.5 * (self.forward + self.backward)


class BiLM(nn.Module):
    """The biLM of Peters et al. 2018; ``softmax`` exists only when ``vocab_size`` is given.

    ``stateful=True`` carries each row's final states to the next ``forward``, as bilm-tf's
    inference graph did.
    """

    bos_ids: torch.Tensor  # (W,) the <S> marker, +1 convention
    eos_ids: torch.Tensor  # (W,) the </S> marker

    def __init__(
        self, config: ModelConfig, vocab_size: int | None = None, *, stateful: bool = False
    ) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.stateful = stateful
        projection_dim = config.lstm.projection_dim
        self.token_encoder = CharCNN(config)
        self.forward_lstm = build_lstm(config, projection_dim)
        self.backward_lstm = build_lstm(config, projection_dim)
        self.dropout = nn.Dropout(config.dropout)  # on the top output, before the softmax
        self.softmax = (
            SampledSoftmax(vocab_size, projection_dim, config.num_samples)
            if vocab_size is not None
            else None
        )
        self.register_buffer("bos_ids", torch.from_numpy(BOS_IDS).long(), persistent=False)
        self.register_buffer("eos_ids", torch.from_numpy(EOS_IDS).long(), persistent=False)
        for name in START_STATE_BUFFERS:  # the warm start: none, or (L, 1, P|H) each
            self.register_buffer(name, None, persistent=False)
        self.warmup: list[list[str]] = []  # saved with the model: its start state on load
        self._carried: BiLMState | None = None

    @property
    def num_layers(self) -> int:
        """Layers of ``activations``: the token layer plus one per LSTM layer."""
        return self.config.lstm.num_layers + 1

    def reset_states(self) -> None:
        """Forget the carried states: the next call starts every row from the start state."""
        self._carried = None

    def set_start_state(self, state: BiLMState | None, warmup: list[list[str]]) -> None:
        """Start every row of ``forward`` from ``state`` (one row per stack; ``None``: from
        zero, as bilm-tf does). ``warmup``: the sentences saved with the model, which the start
        state is read from when it is loaded (:mod:`elmo_core.model.warm_start`)."""
        parts = (
            [None] * 4 if state is None else [part.detach() for stack in state for part in stack]
        )
        for name, tensor in zip(START_STATE_BUFFERS, parts, strict=True):
            setattr(self, name, tensor)
        self.warmup = [list(sentence) for sentence in warmup]

    def start_state(self, batch_size: int, dtype: torch.dtype) -> BiLMState | None:
        """The warm start for ``batch_size`` rows, or None (zero) when the model has none."""
        parts = [getattr(self, name) for name in START_STATE_BUFFERS]
        if parts[0] is None:
            return None
        h_f, c_f, h_b, c_b = (p.to(dtype).expand(-1, batch_size, -1).contiguous() for p in parts)
        return LSTMState(h_f, c_f), LSTMState(h_b, c_b)

    def forward(self, char_ids: torch.Tensor, state: BiLMState | None = None) -> BiLMOutput:
        """``char_ids (B, T, W)`` without markers -> ``activations``, ``mask``, ``state``.

        ``activations``: ``L + 1`` tensors ``(B, T + 2, 2P)`` — ``[x; x]`` then ``[f_k; b_k]`` —
        zero where ``mask (B, T + 2)`` is False. ``state``: the new (forward, backward) states; the
        backward one is the backward stack's final state (after reading ``<S>``), as in bilm-tf.
        Without a ``state`` (or a carried one), rows start from the model's start state.
        """
        ids, mask, lengths = self.add_sentence_markers(char_ids.long())  # (B, T+2, W)
        batch_size = ids.shape[0]
        if state is None and self.stateful:
            state = self._carried_rows(batch_size, ids.device)
        embedded = self.token_encoder.encode_types(ids) * mask.unsqueeze(-1)  # (B, T+2, P)
        if state is None:
            state = self.start_state(batch_size, self.forward_lstm.state_dtype)
        forward_state, backward_state = state if state is not None else (None, None)

        reverse = reversal_index(lengths, ids.shape[1])  # (B, T+2)
        both = torch.stack([embedded, gather_positions(embedded, reverse)])  # (2, B, T+2, P)
        (forward_outputs, backward_outputs), (forward_state, backward_state) = self._run_lstms(
            both, mask.expand(2, -1, -1), (forward_state, backward_state)
        )
        activations = [torch.cat([embedded, embedded], dim=-1)]  # (B, T+2, 2P)
        for forward_k, backward_k in zip(forward_outputs, backward_outputs, strict=True):
            aligned = gather_positions(backward_k, reverse)  # (B, T+2, P): un-reversed
            activations.append(torch.cat([forward_k, aligned], dim=-1))  # (B, T+2, 2P)

        new_state = (forward_state, backward_state)
        if self.stateful:
            self._store(new_state)
        return BiLMOutput(activations, mask, new_state)

    def training_loss(
        self,
        forward_inputs: torch.Tensor,
        forward_targets: torch.Tensor,
        backward_inputs: torch.Tensor,
        backward_targets: torch.Tensor,
        state: BiLMState | None = None,
        candidates: tuple[SampledCandidates, SampledCandidates] | None = None,
        types: TokenTypes | None = None,
        softmax_rows: torch.Tensor | None = None,
    ) -> tuple[LossOutput, BiLMState]:
        """Language-model loss on two independent streams of windows (bilm-tf ``total_loss``).

        Arguments as ``score_window``. The softmax is sampled in train mode and exact in eval
        mode; ``candidates`` (forward, backward) are sets drawn ahead, else the softmax draws
        them; ``softmax_rows (U,)``: the sorted, distinct ids of both windows' targets and
        candidates, found ahead (then their rows are gathered once), else each direction finds
        its own. The returned state is attached to the graph; the caller detaches it between
        windows (truncated BPTT).
        """
        if self.softmax is None:
            raise ConfigError("a BiLM built without vocab_size has no softmax", key="vocab_size")
        drawn = iter(candidates if candidates is not None else (None, None))
        softmax = self.softmax
        gathered: list[SoftmaxRows] = []

        def rows() -> SoftmaxRows | None:
            """Both directions' rows, gathered once, as the first is scored: after the LSTMs,
            so that the backward reaches the rows' gradients before the LSTMs' (an exchange of
            them can then start while the LSTMs' backward runs)."""
            if softmax_rows is None or not softmax.training:
                return None
            if not gathered:
                gathered.append(softmax.gather_rows(softmax_rows))
            return gathered[0]

        (forward_loss, num_tokens), (backward_loss, _), state = self.score_window(
            forward_inputs,
            forward_targets,
            backward_inputs,
            backward_targets,
            # score_window scores the forward direction, then the backward one
            lambda output, targets: self._mean_loss(output, targets, next(drawn), rows()),
            state,
            types,
        )
        return LossOutput(forward_loss, backward_loss, num_tokens), state

    def score_window(
        self,
        forward_inputs: torch.Tensor,
        forward_targets: torch.Tensor,
        backward_inputs: torch.Tensor,
        backward_targets: torch.Tensor,
        score: Callable[[DirectionOutput, torch.Tensor], Score],
        state: BiLMState | None = None,
        types: TokenTypes | None = None,
    ) -> tuple[Score, Score, BiLMState]:
        """Each direction's top layer on its stream window, scored by ``score(output, targets)``.

        ``*_inputs (B, T, W)`` char ids already holding ``<S>``/``</S>`` (the backward stream in
        reversed order), ``*_targets (B, T)`` vocabulary ids, negative where not scored; an
        all-zero token is padding and leaves the state untouched. The token types of both streams
        are encoded in one call, both LSTM stacks run, then each direction is scored (the order of
        the random draws of dropout and of the sampled softmax). ``types``: both streams' distinct
        token types found ahead on the CPU (the training data loader's), else found here. Never
        uses the ``stateful`` carry.
        """
        char_ids = torch.stack([forward_inputs, backward_inputs]).long()  # (2, B, T, W)
        embedded = self.token_encoder.encode_types(char_ids, types)  # (2, B, T, P): types once
        masks = (char_ids != 0).any(dim=-1)  # (2, B, T)
        outputs, new_states = self._run_lstms(embedded, masks, state or (None, None))
        scores = [
            score(DirectionOutput(self.dropout(layers[-1]), masks[index]), targets)  # top layer
            for index, (layers, targets) in enumerate(
                zip(outputs, (forward_targets, backward_targets), strict=True)
            )
        ]
        return scores[0], scores[1], new_states

    def _run_lstms(
        self,
        inputs: torch.Tensor,
        masks: torch.Tensor,
        states: tuple[LSTMState | None, LSTMState | None],
    ) -> tuple[tuple[list[torch.Tensor], list[torch.Tensor]], BiLMState]:
        """Both stacks on ``inputs (2, B, T, P)``, ``masks (2, B, T)``: together when
        ``batch_directions``, else in turn. -> each stack's layer outputs and new state."""
        stacks = (self.forward_lstm, self.backward_lstm)
        if self.config.batch_directions:
            return run_both_directions(stacks, inputs, masks, states)
        (forward, forward_state), (backward, backward_state) = (
            stack(inputs[index], masks[index], states[index]) for index, stack in enumerate(stacks)
        )
        return (forward, backward), (forward_state, backward_state)

    def _mean_loss(
        self,
        output: DirectionOutput,
        targets: torch.Tensor,
        drawn: SampledCandidates | None = None,
        rows: SoftmaxRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean softmax loss over the scored positions, and their number."""
        assert self.softmax is not None
        top = output.top
        scored = output.scored(targets)  # (B, T)
        losses = self.softmax(
            top.reshape(-1, top.shape[-1]),
            targets.clamp(min=0).reshape(-1),
            drawn=drawn,
            rows=rows,
        )  # (B·T,): unscored positions are computed (no host sync) and weighted out
        num_scored = scored.sum()
        mean = (losses * scored.reshape(-1)).sum() / num_scored.clamp(min=1)
        return mean, num_scored

    def add_sentence_markers(
        self, char_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``<S>`` first and ``</S>`` after each row's last real token; none in an empty row.

        Returns ids ``(B, T+2, W)``, mask ``(B, T+2)`` and lengths with markers ``(B,)``.
        """
        batch_size, num_tokens, width = char_ids.shape
        lengths = (char_ids != 0).any(dim=-1).sum(dim=1)  # (B,) real tokens, padded on the right
        lengths = torch.where(lengths > 0, lengths + 2, lengths)  # (B,)
        positions = torch.arange(num_tokens + 2, device=char_ids.device)  # (T+2,)
        ids = char_ids.new_zeros(batch_size, num_tokens + 2, width)  # (B, T+2, W)
        ids[:, 1:-1] = char_ids
        is_bos = ((positions == 0) & (lengths > 0).unsqueeze(1)).unsqueeze(-1)  # (B, T+2, 1)
        is_eos = (positions == (lengths - 1).unsqueeze(1)).unsqueeze(-1)  # (B, T+2, 1)
        ids = torch.where(is_bos, self.bos_ids, torch.where(is_eos, self.eos_ids, ids))
        mask = positions < lengths.unsqueeze(1)  # (B, T+2)
        return ids, mask, lengths

    def _carried_rows(self, batch_size: int, device: torch.device) -> BiLMState | None:
        """The stored states for the first ``batch_size`` rows; rows never seen start from the
        start state."""
        if self._carried is None:
            return None
        start = self.start_state(batch_size, self._carried[0].h.dtype)
        rows = []
        lstms = (self.forward_lstm, self.backward_lstm)
        for index, (lstm, carried) in enumerate(zip(lstms, self._carried, strict=True)):
            fresh = (
                lstm.zero_state(batch_size, device, carried.h.dtype)
                if start is None
                else start[index]
            )
            kept = min(batch_size, carried.h.shape[1])
            fresh.h[:, :kept] = carried.h[:, :kept]
            fresh.c[:, :kept] = carried.c[:, :kept]
            rows.append(fresh)
        return rows[0], rows[1]

    def _store(self, state: BiLMState) -> None:
        """Keep the new states detached; stored rows beyond this batch are kept as they were."""
        stored = []
        for index, new in enumerate(state):
            new = new.detach()
            old = None if self._carried is None else self._carried[index]
            if old is not None and old.h.shape[1] > new.h.shape[1]:
                new = LSTMState(
                    torch.cat([new.h, old.h[:, new.h.shape[1] :]], dim=1),
                    torch.cat([new.c, old.c[:, new.c.shape[1] :]], dim=1),
                )
            stored.append(new)
        self._carried = (stored[0], stored[1])


def reversal_index(lengths: torch.Tensor, num_positions: int) -> torch.Tensor:
    """Per row, position ``t < length`` reads ``length − 1 − t``; padding stays where it is.

    The index is its own inverse, so the same gather reverses inputs and un-reverses outputs.
    """
    positions = torch.arange(num_positions, device=lengths.device).unsqueeze(0)  # (1, T)
    last = (lengths - 1).unsqueeze(1)  # (B, 1)
    return torch.where(positions <= last, last - positions, positions)  # (B, T)


def gather_positions(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values (B, T, D)`` reordered along T by ``index (B, T)``."""
    return values.gather(1, index.unsqueeze(-1).expand(-1, -1, values.shape[-1]))
