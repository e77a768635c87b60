"""The evaluation record: what ``evaluate`` measured, and what ``register`` tags a version with.

One record for every reader: the stage's result, its ``--output`` JSON, register and the flows.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from elmo_core.errors import DataError
from elmo_core.location import atomic_write
from elmo_core.perplexity import Protocol


class EvaluationResult(BaseModel):
    """Perplexities of one model on one selection of heldout data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    forward_perplexity: float
    backward_perplexity: float
    perplexity: float  # geometric mean of the two directions
    num_tokens: int  # positions predicted: each sentence's words and its end
    split: str
    files: list[str] | None
    protocol: Protocol
    heldout_hash: str  # sha256 over the evaluated shards' sha256s
    run_id: str | None = None  # the MLflow run holding the metrics
    # Rows whose LSTM state locked up (cells at the clip) in some window, of num_rows evaluated
    # side by side; 0 in records written before they were counted.
    forward_trapped: int = 0
    backward_trapped: int = 0
    num_rows: int = 0

    def summary(self) -> str:
        """One line: the flow's log and the evaluate run's description."""
        return (
            f"{self.split} perplexity {self.perplexity:.2f} (forward "
            f"{self.forward_perplexity:.2f}, backward {self.backward_perplexity:.2f}) "
            f"over {self.num_tokens:,} predicted tokens"
        )

    def metrics(self) -> dict[str, float]:
        """The perplexities by their MLflow names, ``<split>_perplexity[_forward|_backward]``:
        the evaluate run's, the registered model's and the flow's."""
        return {
            f"{self.split}_perplexity": self.perplexity,
            f"{self.split}_perplexity_forward": self.forward_perplexity,
            f"{self.split}_perplexity_backward": self.backward_perplexity,
        }

    def rows(self) -> list[dict[str, object]]:
        """Forward, backward and their geometric mean, as the paper reports them (full
        softmax): the evaluate run's table and the flow's artifact."""
        return [
            {
                "split": self.split,
                "direction": direction,
                "perplexity": round(value, 2),
                "tokens": self.num_tokens,
            }
            for direction, value in (
                ("forward", self.forward_perplexity),
                ("backward", self.backward_perplexity),
                ("mean (geometric)", self.perplexity),
            )
        ]

    @classmethod
    def read(cls, path: Path) -> EvaluationResult:
        """The record saved by :meth:`write`; anything else is a DataError naming the file."""
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as err:
            raise DataError(f"not an evaluation result: {err}", path=str(path)) from None

    def write(self, path: Path) -> None:
        """Save as JSON, whole or not at all."""
        text = self.model_dump_json(indent=2)
        atomic_write(path, lambda target: target.write_text(text, encoding="utf-8"))
