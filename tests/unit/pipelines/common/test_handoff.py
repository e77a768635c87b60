"""Which model of a finished training run is handed on to evaluate and register, and what it
says of itself."""

from __future__ import annotations

from pipelines.common.handoff import CHECKPOINT_STEP_TAG, CHECKPOINT_TAG, TrainResult

# A FINISHED.json as runs wrote it before they recorded the best model's step.
FINISHED = {
    "run_name": "bilm-1",
    "run_dir": "/runs/bilm-1",
    "model_dir": "/runs/bilm-1/model",
    "best_model_dir": "/runs/bilm-1/best",
    "mlflow_run_id": "r1",
    "steps": 3000,
    "total_steps": 3000,
    "resumed_from_step": 0,
    "best_perplexity": 151.0,
    "stopped_early": False,
    "seconds": 60.0,
}


def test_the_best_model_is_handed_on_unless_the_final_one_is_asked_for():
    result = TrainResult.model_validate({**FINISHED, "best_step": 2000})

    best, final = result.handed_on(), result.handed_on("final")

    assert (best.model_dir, best.checkpoint, best.step) == ("/runs/bilm-1/best", "best", 2000)
    assert best.tags == {CHECKPOINT_TAG: "best", CHECKPOINT_STEP_TAG: "2000"}
    assert best.description == "the best model (step 2000, validation perplexity 151.00)"
    assert (final.model_dir, final.checkpoint, final.step) == ("/runs/bilm-1/model", "final", 3000)
    assert final.tags == {CHECKPOINT_TAG: "final", CHECKPOINT_STEP_TAG: "3000"}
    assert final.description == "the final model (step 3000)"


def test_a_run_without_a_best_model_hands_on_its_final_one_and_says_why():
    result = TrainResult.model_validate(
        {**FINISHED, "best_model_dir": None, "best_perplexity": None}
    )

    handed = result.handed_on("best")

    assert (handed.model_dir, handed.checkpoint, handed.step) == (
        "/runs/bilm-1/model",
        "final",
        3000,
    )
    assert handed.description == (
        "the final model (step 3000): no validation ran, so there is no best model"
    )


def test_an_older_runs_record_still_reads_and_hands_on_its_best_model_without_a_step():
    result = TrainResult.model_validate(FINISHED)

    handed = result.handed_on()

    assert result.best_step is None
    assert handed.model_dir == "/runs/bilm-1/best" and handed.tags == {CHECKPOINT_TAG: "best"}
    assert handed.description == "the best model (validation perplexity 151.00)"
