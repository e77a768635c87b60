"""Dependency parsing: a head and a relation for every word (CoNLL-U trees), by a biaffine parser
over the shared encoder (Dozat & Manning 2017), the use that won the CoNLL 2018 shared task with
ELMo (Che et al. 2018). Decoded trees are well formed: one word on the root, no cycle.

A word's target id packs its head and relation, ``head · R + relation`` (R relations), so a
split stays one id per token. The head's scores are ``(B, T, T + 1, 1 + R)``: for each word and
each candidate head (0 the root, then the words), the arc score and each relation's score.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.tasks.dataset import TaskDataset
from elmo_core.tasks.heads import HeadInput, TaskHead
from elmo_core.tasks.types.base import (
    SENTENCE,
    TOKENS,
    Column,
    ErrorTables,
    Format,
    Prediction,
    Table,
    TaskType,
    label_table,
)
from elmo_core.tasks.types.parsing.conllu import ParseExample, read_conllu_trees
from elmo_core.tasks.types.parsing.trees import max_spanning_tree

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig, Split, TaskConfig

HEADS, RELATIONS = "heads", "relations"
PUNCTUATION = "punct"  # UD's relation of every punctuation mark
DISTANCES = ((1, 1), (2, 2), (3, 6), (7, 10**9))  # attachment distance buckets, in words
NUM_CONFUSIONS = 15
UNIVERSAL_RELATIONS = (  # Universal Dependencies v2's 37
    "acl",
    "advcl",
    "advmod",
    "amod",
    "appos",
    "aux",
    "case",
    "cc",
    "ccomp",
    "clf",
    "compound",
    "conj",
    "cop",
    "csubj",
    "dep",
    "det",
    "discourse",
    "dislocated",
    "expl",
    "fixed",
    "flat",
    "goeswith",
    "iobj",
    "list",
    "mark",
    "nmod",
    "nsubj",
    "nummod",
    "obj",
    "obl",
    "orphan",
    "parataxis",
    "punct",
    "reparandum",
    "root",
    "vocative",
    "xcomp",
)


class BiaffineHead(TaskHead):
    """Arc scores ``dᵢᵀ U hⱼ + hⱼᵀ u`` and relation scores ``[dᵢ; 1]ᵀ Wᵣ [hⱼ; 1]`` over MLPs of the
    encoder's output, a learned root vector as candidate head 0; each MLP ``hidden_dim`` wide."""

    def __init__(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int = 0
    ) -> None:
        super().__init__(input_dim, num_labels, config, output_elmo_dim)
        width = config.hidden_dim
        self.root = nn.Parameter(torch.zeros(self.encoded_dim))
        self.mlps = nn.ModuleDict(
            {
                name: nn.Sequential(
                    nn.Linear(self.encoded_dim, width), nn.ReLU(), nn.Dropout(config.dropout)
                )
                for name in ("arc_dependent", "arc_head", "relation_dependent", "relation_head")
            }
        )
        self.arc_weight = nn.Parameter(torch.zeros(width, width))
        self.arc_bias = nn.Parameter(torch.zeros(width))
        self.relation_weight = nn.Parameter(torch.zeros(num_labels, width + 1, width + 1))

    def forward(self, sides: Sequence[HeadInput]) -> torch.Tensor:
        """One side → ``(B, T, T + 1, 1 + R)``: arc score, then each relation's."""
        (side,) = sides
        words = self.dropout(self.encode(side))  # (B, T, E)
        root = self.root.expand(words.shape[0], 1, -1)  # (B, 1, E)
        nodes = torch.cat([root, words], dim=1)  # (B, T + 1, E)
        dependent, head = self.mlps["arc_dependent"](words), self.mlps["arc_head"](nodes)
        arcs = dependent @ self.arc_weight @ head.transpose(1, 2)  # (B, T, T + 1)
        arcs = arcs + (head @ self.arc_bias).unsqueeze(1)  # a head's own prior
        ones = words.new_ones(*words.shape[:2], 1)
        dependent = torch.cat([self.mlps["relation_dependent"](words), ones], dim=-1)
        head = torch.cat(
            [self.mlps["relation_head"](nodes), ones[:, :1].expand(-1, nodes.shape[1], -1)], -1
        )
        left = torch.einsum("bia,rac->birc", dependent, self.relation_weight)  # (B, T, R, W+1)
        relations = torch.einsum("birc,bjc->bijr", left, head)  # (B, T, T + 1, R)
        return torch.cat([arcs.unsqueeze(-1), relations], dim=-1)

    def loss(self, scores: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each word's gold head among the root and its sentence's words, plus
        that of its gold relation at the gold head."""
        size = scores.shape[-1] - 1
        heads, relations = targets // size, targets % size  # (B, T)
        arcs = _arc_log_probs(scores, mask)  # (B, T, T + 1)
        arc_loss = nn.functional.nll_loss(arcs[mask], heads[mask])
        at_gold = scores[..., 1:].gather(2, heads[..., None, None].expand(-1, -1, 1, size))
        relation_loss = nn.functional.cross_entropy(at_gold.squeeze(2)[mask], relations[mask])
        return arc_loss + relation_loss

    def decode(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each sentence's maximum spanning tree (one word on the root) over the arcs' log
        probabilities, each word's best relation at its head → packed ids ``(B, T)``, 0 at
        padding."""
        size = scores.shape[-1] - 1
        arcs = _arc_log_probs(scores, mask).detach().cpu().numpy()  # (B, T, T + 1)
        lengths = mask.sum(dim=1).tolist()
        heads = torch.zeros(mask.shape, dtype=torch.long)
        for row, length in enumerate(lengths):
            graph = np.full((length + 1, length + 1), -np.inf)
            graph[1:] = arcs[row, :length, : length + 1]
            heads[row, :length] = torch.from_numpy(max_spanning_tree(graph))
        heads = heads.to(scores.device)
        at_head = scores[..., 1:].gather(2, heads[..., None, None].expand(-1, -1, 1, size))
        relations = at_head.squeeze(2).argmax(dim=-1)  # (B, T)
        return (heads * size + relations) * mask.long()


def _arc_log_probs(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-softmax of the arc scores over the root and the sentence's own words."""
    candidates = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)  # (B, T + 1)
    arcs = scores[..., 0].masked_fill(~candidates.unsqueeze(1), torch.finfo(scores.dtype).min)
    return torch.log_softmax(arcs, dim=-1)


class TreeOptions(StrictModel):
    conllu_relations: Literal["universal", "full"] = Field(
        "universal",
        description="relations without their subtypes (nmod:poss → nmod), as CoNLL 2018's LAS "
        "compares them, or as written",
    )
    punctuation: Literal["counted", "excluded"] = Field(
        "counted",
        description="whether UAS and LAS count the words attached as punct (CoNLL 2018 counts "
        "every word)",
    )


def _options(task: TaskConfig) -> TreeOptions:
    return cast(TreeOptions, task.reader)


def _trees(path: Path, options: TreeOptions, split: Split) -> TaskDataset[ParseExample]:
    return read_conllu_trees(path, relations=options.conllu_relations)


class Parsing(TaskType):
    name = "parsing"
    summary = "A head and a relation for every word"
    formats = (Format("conllu", _trees, TreeOptions),)

    def head(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
    ) -> TaskHead:
        return BiaffineHead(input_dim, num_labels, config, output_elmo_dim)

    def main_metric(self, task: TaskConfig) -> str:
        return "las"

    def known_labels(self, task: TaskConfig) -> list[str] | None:
        """UD's 37 universal relations, when subtypes are dropped: a rare relation of dev or
        test (``dep``, ``reparandum``) need not occur in a small training set."""
        return list(UNIVERSAL_RELATIONS) if _options(task).conllu_relations == "universal" else None

    def scores(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: np.ndarray,
        predicted: np.ndarray,
        offsets: np.ndarray,
    ) -> dict[str, float]:
        """UAS and LAS over every word (CoNLL 2018), or over the words not attached as
        ``punct`` with ``reader.punctuation: excluded``."""
        size = len(labels)
        scored = np.ones(len(gold), dtype=bool)
        if _options(task).punctuation == "excluded" and PUNCTUATION in labels:
            scored = gold % size != list(labels).index(PUNCTUATION)
        if not scored.any():
            raise ValueError("attachment scores of no words are undefined")
        attached = (gold // size == predicted // size)[scored]
        labelled = (gold == predicted)[scored]
        return {"uas": float(attached.mean()), "las": float(labelled.mean())}

    def token_labels(self, ids: Sequence[int], labels: Sequence[str]) -> list[str]:
        """``head:relation`` of each word."""
        return [f"{i // len(labels)}:{labels[i % len(labels)]}" for i in ids]

    def gold(self, example: ParseExample) -> list[str]:
        return [f"{h}:{r}" for h, r in zip(example.heads, example.relations, strict=True)]

    def text_columns(self, example: ParseExample) -> dict[str, str]:
        return {SENTENCE: " ".join(example.tokens)}

    def outputs(self) -> tuple[Column, ...]:
        return (
            Column(TOKENS, "strings", "the words read"),
            Column(HEADS, "integers", "each word's head: 0 the root, else a word from 1"),
            Column(RELATIONS, "strings", "each word's relation to its head"),
        )

    def output_rows(
        self, tokens: Sequence[list[str]], predictions: Sequence[Prediction | None]
    ) -> dict[str, list[Any]]:
        arcs = [[_arc(word) for word in words or []] for words in predictions]
        return {
            TOKENS: list(tokens),
            HEADS: [[head for head, _ in words] for words in arcs],
            RELATIONS: [[relation for _, relation in words] for words in arcs],
        }

    def no_prediction(self) -> list[str]:
        return []

    def error_tables(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: Sequence[Prediction],
        predicted: Sequence[Prediction],
    ) -> ErrorTables:
        """Scores of each relation, the relations most confused on rightly attached words, and
        attachment by the distance of each word to its gold head."""
        words = [
            (i, _arc(g), _arc(p))
            for sentence, guess in zip(gold, predicted, strict=True)
            for i, (g, p) in enumerate(zip(sentence, guess, strict=True), start=1)
        ]
        gold_relations = [g[1] for _, g, _ in words]
        predicted_relations = [p[1] for _, _, p in words]
        confused = Counter(
            (g[1], p[1]) for _, g, p in words if g[0] == p[0] and g[1] != p[1]
        ).most_common(NUM_CONFUSIONS)
        return ErrorTables(
            per_type=label_table(gold_relations, predicted_relations, labels),
            more={
                "relations_confused.json": {
                    "gold": [g for (g, _), _ in confused],
                    "predicted": [p for (_, p), _ in confused],
                    "words": [count for _, count in confused],
                },
                "attachment_by_distance.json": _by_distance(words),
            },
        )


def _arc(word: str) -> tuple[int, str]:
    head, _, relation = word.partition(":")
    return int(head), relation


def _by_distance(words: list[tuple[int, tuple[int, str], tuple[int, str]]]) -> Table:
    """UAS and LAS of the words at each distance from their gold head (the root apart)."""
    table: Table = {"distance": [], "words": [], "uas": [], "las": []}
    names = ["root", *(_bucket(low, high) for low, high in DISTANCES)]
    for name in names:
        found = [(g, p) for i, g, p in words if _distance(i, g[0]) == name]
        if found:
            table["distance"].append(name)
            table["words"].append(len(found))
            table["uas"].append(sum(g[0] == p[0] for g, p in found) / len(found))
            table["las"].append(sum(g == p for g, p in found) / len(found))
    return table


def _bucket(low: int, high: int) -> str:
    return str(low) if low == high else (f"{low}-{high}" if high < 10**9 else f"{low}+")


def _distance(word: int, head: int) -> str:
    """The bucket of ``word``'s distance to ``head``, or ``root``."""
    if head == 0:
        return "root"
    return next(_bucket(lo, hi) for lo, hi in DISTANCES if lo <= abs(word - head) <= hi)
