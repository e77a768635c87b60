"""The champion policy's rule, records and reasons, without a store (tests/integration: the
rule against a real registry)."""

import pytest
from mlflow.entities.model_registry import ModelVersion, ModelVersionTag

from pipelines.registry.policy import PromotionDecision, decide, decision_tags, perplexity_of
from pipelines.registry.tags import (
    HELDOUT_HASH_TAG,
    PERPLEXITY_TAG,
    PREVIOUS_CHAMPION_TAG,
    PROMOTION_ALIAS_TAG,
    PROTOCOL_TAG,
    REASON_TAG,
    VOCAB_HASH_TAG,
)


def _version(number: int, perplexity: float | str | None, **changed: str | None) -> ModelVersion:
    tags = {PERPLEXITY_TAG: str(perplexity), HELDOUT_HASH_TAG: "h", VOCAB_HASH_TAG: "v"}
    tags |= changed
    tags = {key: value for key, value in tags.items() if value is not None and value != "None"}
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


def _differs(what: str, tag: str, ours: str, theirs: str) -> str:
    return f"not comparable: {what} differs from champion v1's ({tag} {ours} vs {theirs})"


@pytest.mark.parametrize(
    ("candidate", "champion", "expected"),
    [
        (
            _version(2, None),
            _version(1, 41.0),
            PromotionDecision(
                "challenger",
                "no heldout perplexity: only an explicit promotion makes it champion",
                1,
            ),
        ),
        (
            _version(1, 41.0),
            None,
            PromotionDecision("champion", "first champion: heldout perplexity 41", None),
        ),
        (
            _version(2, 31.0),
            _version(1, 41.0),
            PromotionDecision("champion", "heldout perplexity 31 beats champion v1's 41", 1),
        ),
        (
            _version(2, 41.0),
            _version(1, 41.0),
            PromotionDecision("challenger", "heldout perplexity 41 ties champion v1's 41", 1),
        ),
        (
            _version(2, 30.5),
            _version(1, "nan"),
            PromotionDecision(
                "challenger", "not comparable: champion v1 has no heldout perplexity", 1
            ),
        ),
        (
            _version(2, 30.5, **{HELDOUT_HASH_TAG: "other"}),
            _version(1, 41.0),
            PromotionDecision(
                "challenger",
                _differs("heldout data", HELDOUT_HASH_TAG, "other", "h"),
                1,
            ),
        ),
        (
            _version(2, 30.5),
            _version(1, 41.0, **{VOCAB_HASH_TAG: None}),
            PromotionDecision(
                "challenger",
                _differs("vocabulary", VOCAB_HASH_TAG, "v", "missing"),
                1,
            ),
        ),
        (
            _version(2, 30.5, **{PROTOCOL_TAG: "original"}),
            _version(1, 41.0, **{PROTOCOL_TAG: "batched"}),
            PromotionDecision(
                "challenger",
                _differs("evaluation protocol", PROTOCOL_TAG, "original", "batched"),
                1,
            ),
        ),
        (
            _version(2, 30.5, **{PROTOCOL_TAG: "batched"}),
            _version(1, 41.0),
            PromotionDecision("champion", "heldout perplexity 30.5 beats champion v1's 41", 1),
        ),
    ],
    ids=[
        "no-perplexity",
        "first",
        "beats",
        "ties",
        "champion-without",
        "heldout-differs",
        "vocab-missing",
        "protocol-differs",
        "protocol-on-one-only",
    ],
)
def test_the_rule_gives_each_case_its_alias_reason_and_previous_champion(
    candidate: ModelVersion, champion: ModelVersion | None, expected: PromotionDecision
) -> None:
    assert decide(candidate, champion) == expected


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("41.5", 41.5),
        ("0.5", 0.5),
        ("0", None),
        ("-3", None),
        ("nan", None),
        ("inf", None),
        ("forty", None),
        (None, None),
    ],
)
def test_a_perplexity_is_read_only_when_a_finite_positive_number(
    written: str | None, read: float | None
) -> None:
    assert perplexity_of(_version(1, written)) == read
