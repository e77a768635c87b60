"""The champion policy's records and reasons, without a store (tests/integration: the rule)."""

from mlflow.entities.model_registry import ModelVersion, ModelVersionTag

from pipelines.registry.policy import PromotionDecision, decide, decision_tags
from pipelines.registry.tags import (
    HELDOUT_HASH_TAG,
    PERPLEXITY_TAG,
    PREVIOUS_CHAMPION_TAG,
    PROMOTION_ALIAS_TAG,
    REASON_TAG,
    VOCAB_HASH_TAG,
)


def _version(number: int, perplexity: float) -> ModelVersion:
    tags = {PERPLEXITY_TAG: str(perplexity), HELDOUT_HASH_TAG: "h", VOCAB_HASH_TAG: "v"}
    return ModelVersion(
        "elmo-bilm",
        str(number),
        0,
        tags=[ModelVersionTag(key, value) for key, value in tags.items()],
    )


def test_a_decision_is_recorded_as_alias_reason_and_the_champion_it_was_measured_against():
    decision = PromotionDecision("challenger", "does not beat champion v2's 31", 2)
    assert decision_tags(decision) == {
        PROMOTION_ALIAS_TAG: "challenger",
        REASON_TAG: "does not beat champion v2's 31",
        PREVIOUS_CHAMPION_TAG: "2",
    }
    first = PromotionDecision("champion", "first champion: heldout perplexity 41", None)
    assert PREVIOUS_CHAMPION_TAG not in decision_tags(first)


def test_reasons_print_perplexities_to_two_decimals_as_the_flow_log_does():
    assert decide(_version(1, 596.20713), None).reason == (
        "first champion: heldout perplexity 596.21"
    )
    assert decide(_version(2, 31.0), _version(1, 41.0)).reason == (
        "heldout perplexity 31 beats champion v1's 41"
    )


def test_two_perplexities_equal_to_two_decimals_are_printed_with_the_digits_that_differ():
    decision = decide(_version(2, 52.3043), _version(1, 52.3012))
    assert decision.reason == "heldout perplexity 52.3043 does not beat champion v1's 52.3012"
