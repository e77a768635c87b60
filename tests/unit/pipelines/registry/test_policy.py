"""The champion policy's records, without a store (tests/integration covers the rule)."""

from pipelines.registry.policy import PromotionDecision, decision_tags
from pipelines.registry.tags import PREVIOUS_CHAMPION_TAG, PROMOTION_ALIAS_TAG, REASON_TAG


def test_a_decision_is_recorded_as_alias_reason_and_the_champion_it_was_measured_against():
    decision = PromotionDecision("challenger", "does not beat champion v2's 31", 2)
    assert decision_tags(decision) == {
        PROMOTION_ALIAS_TAG: "challenger",
        REASON_TAG: "does not beat champion v2's 31",
        PREVIOUS_CHAMPION_TAG: "2",
    }
    first = PromotionDecision("champion", "first champion: heldout perplexity 41", None)
    assert PREVIOUS_CHAMPION_TAG not in decision_tags(first)
