"""The state stateless inference starts from: the biLM's own state after a few whole sentences.

Training reaches a sentence's ``<S>`` after the previous ``</S>``, from zero only at step 1, and a
forward LSTM can learn a trap it falls into only from zero (cells locked at the clip on sentences
opening with a quote). The sentences are stored with the model, so every load starts the same; a
model without them (a bilm-tf import) starts from zero, as bilm-tf does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from elmo_core.data.manifest import Manifest
from elmo_core.data.reader import WordTypes, iter_sentences
from elmo_core.location import atomic_write
from elmo_core.model.bilm import BiLM, BiLMState
from elmo_core.text.char_ids import batch_to_ids

WARMUP_FILE = "warmup.txt"
WARMUP_TOKENS = 48  # at least this many tokens of whole sentences
SENTENCE_TOKENS = (4, 40)  # a warm-up sentence's length, inclusive: ordinary, not a heading


def choose_warmup(
    sentences: Iterable[Sequence[str]], num_tokens: int = WARMUP_TOKENS
) -> list[list[str]]:
    """The first ``sentences`` of ordinary length that open with a letter or a digit (not with
    the quote or bracket a locked-up state was seen to start from), until ``num_tokens``."""
    chosen: list[list[str]] = []
    shortest, longest = SENTENCE_TOKENS
    for sentence in sentences:
        if shortest <= len(sentence) <= longest and sentence[0][:1].isalnum():
            chosen.append(list(sentence))
            if sum(map(len, chosen)) >= num_tokens:
                break
    return chosen


def dataset_warmup(dataset_url: str, manifest: Manifest, word_types: WordTypes) -> list[list[str]]:
    """:func:`choose_warmup` over the dataset's training split, in its stored order; its
    ``word_types`` as the caller loaded them."""
    tokens = word_types.tokens

    def sentences() -> Iterator[list[str]]:
        for batch in iter_sentences(dataset_url, "train", manifest=manifest):
            for start, end in zip(batch.offsets[:-1], batch.offsets[1:], strict=True):
                yield [tokens[int(t)].as_py() for t in batch.types[start:end]]

    return choose_warmup(sentences())


def warm_state(bilm: BiLM, sentences: Sequence[Sequence[str]]) -> BiLMState:
    """One row's (forward, backward) state after reading ``sentences`` in turn from zero, each
    with its markers, without dropout."""
    device = bilm.bos_ids.device
    state = (bilm.forward_lstm.zero_state(1, device), bilm.backward_lstm.zero_state(1, device))
    was_training, was_stateful = bilm.training, bilm.stateful
    bilm.eval()
    bilm.stateful = False
    try:
        with torch.no_grad():
            for sentence in sentences:
                state = bilm(batch_to_ids([list(sentence)]).to(device), state).state
    finally:
        bilm.train(was_training)
        bilm.stateful = was_stateful
    return state


def warm_up(bilm: BiLM, sentences: Sequence[Sequence[str]]) -> BiLM:
    """``bilm`` starting every row from the state after ``sentences`` (none: from zero)."""
    warmup = [list(sentence) for sentence in sentences]
    bilm.set_start_state(None, warmup)  # read the sentences from zero, not an older start
    if warmup:
        bilm.set_start_state(warm_state(bilm, warmup), warmup)
    return bilm


def write_warmup(bilm: BiLM, directory: Path) -> None:
    """The warm-up sentences beside the weights; nothing when the model starts from zero."""
    if bilm.warmup:
        text = "".join(" ".join(sentence) + "\n" for sentence in bilm.warmup)
        atomic_write(directory / WARMUP_FILE, lambda path: path.write_text(text, encoding="utf-8"))


def read_warmup(directory: Path) -> list[list[str]]:
    """The sentences :func:`write_warmup` stored, or none."""
    path = directory / WARMUP_FILE
    if not path.is_file():
        return []
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line]
