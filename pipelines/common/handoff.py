"""What one stage hands on to the next: the training run's result and the model it hands on.

The train, evaluate and register stages and the flow all read these types, so they live below
every stage: no stage imports a later one to learn what an earlier one produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

CHECKPOINT_TAG = "elmo.bilm_checkpoint"  # which model of its run a run or version holds
CHECKPOINT_STEP_TAG = "elmo.bilm_checkpoint_step"  # the step that model was saved at
DATASET_TAG = "elmo.dataset"  # the dataset a run read, or a biLM version was trained on
HandOn = Literal["best", "final"]  # which model of a finished run evaluate and register get


@dataclass(frozen=True)
class HandedOn:
    """The model of a finished run that evaluate and register get, and what it is."""

    model_dir: str
    checkpoint: HandOn  # what it is, which may differ from what was asked (no best model)
    step: int | None  # the step it was saved at; None for a best model an older run left
    description: str  # for a console line: "the best model (step 2000, ...)"

    @property
    def tags(self) -> dict[str, str]:
        """What the evaluate and register runs and the registered version record of it."""
        step = {} if self.step is None else {CHECKPOINT_STEP_TAG: str(self.step)}
        return {CHECKPOINT_TAG: self.checkpoint, **step}


class TrainResult(BaseModel):
    """What a finished run produced; also the content of its ``FINISHED.json``."""

    run_name: str
    run_dir: str
    model_dir: str  # the final model, our format
    best_model_dir: str | None  # the model with the best validation perplexity
    mlflow_run_id: str
    steps: int
    total_steps: int
    resumed_from_step: int
    best_perplexity: float | None
    best_step: int | None = None  # where best_perplexity was measured (older runs: None)
    stopped_early: bool
    seconds: float
    already_finished: bool = False  # True when the run had finished before this call

    def summary(self) -> str:
        """What the run did, in one line: the flow's log and the train run's description."""
        if self.already_finished:
            verb = "reused (already finished)"
        elif self.resumed_from_step:
            verb = f"resumed from step {self.resumed_from_step} and finished"
        else:
            verb = "trained"
        best = (
            ""
            if self.best_perplexity is None
            else f", best validation perplexity {self.best_perplexity:.2f} (heldout sample)"
        )
        return (
            f"biLM {self.run_name} {verb}: {self.steps}/{self.total_steps} steps in "
            f"{self.seconds / 60:.1f} min{best}"
        )

    def handed_on(self, choice: HandOn = "best") -> HandedOn:
        """The model evaluate and register get: by default the best one, since the final model
        can be much worse (a run that diverged after its best validation); the final one when
        asked, or when no validation ran and there is no best model."""
        if choice == "best" and self.best_model_dir is not None:
            where = [] if self.best_step is None else [f"step {self.best_step}"]
            if self.best_perplexity is not None:
                where.append(f"validation perplexity {self.best_perplexity:.2f}")
            detail = f" ({', '.join(where)})" if where else ""
            return HandedOn(self.best_model_dir, "best", self.best_step, f"the best model{detail}")
        description = f"the final model (step {self.steps})"
        if choice == "best":
            description += ": no validation ran, so there is no best model"
        return HandedOn(self.model_dir, "final", self.steps, description)
