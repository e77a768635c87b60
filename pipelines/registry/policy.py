"""Registry policy: which version of ``elmo-bilm`` holds the ``champion`` alias.

Users embed with and adapt from the champion, so it moves only on a strictly lower heldout
perplexity on the same heldout data and vocabulary; other versions take ``challenger``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from elmo_core.errors import ConfigError
from pipelines.registry.tags import (
    CHAMPION,
    HELDOUT_HASH_TAG,
    PERPLEXITY_TAG,
    PREVIOUS_CHAMPION_TAG,
    PROMOTION_ALIAS_TAG,
    PROTOCOL_TAG,
    REASON_TAG,
    SUPERSEDED_BY_TAG,
    VOCAB_HASH_TAG,
)
from pipelines.tracking.stage_runs import use_tracking

CHALLENGER: Final = "challenger"
# What must be equal for two perplexities to be compared: (tag, what it names, always required).
COMPARABILITY = (
    (HELDOUT_HASH_TAG, "heldout data", True),
    (VOCAB_HASH_TAG, "vocabulary", True),
    (PROTOCOL_TAG, "evaluation protocol", False),
)


@dataclass(frozen=True)
class PromotionDecision:
    """The alias a version got, why, and the champion it was measured against (if any).

    The rule gives ``champion`` or ``challenger``; a person may set any alias (:func:`promote`).
    """

    alias: str
    reason: str
    previous_champion: int | None


def apply_champion_policy(
    name: str, version: int, client: MlflowClient | None = None
) -> PromotionDecision:
    """Give ``version`` the ``champion`` or ``challenger`` alias by the rule above; tag why."""
    client = client or MlflowClient(use_tracking())
    candidate = client.get_model_version(name, str(version))
    champion = current_champion(name, client)
    if champion is not None and int(champion.version) == version:
        return PromotionDecision(CHAMPION, "already champion", version)
    decision = decide(candidate, champion)
    if decision.alias == CHAMPION:
        _crown(client, name, version, champion, decision)
    else:
        _record(client, name, version, decision)
        client.set_registered_model_alias(name, CHALLENGER, str(version))
    return decision


def recorded_decision(version: ModelVersion) -> PromotionDecision | None:
    """The decision the rule (or an explicit promotion) recorded on ``version``; None if none."""
    tags = version.tags
    if PROMOTION_ALIAS_TAG not in tags or REASON_TAG not in tags:
        return None
    previous = tags.get(PREVIOUS_CHAMPION_TAG)
    return PromotionDecision(
        tags[PROMOTION_ALIAS_TAG], tags[REASON_TAG], None if previous is None else int(previous)
    )


def promote(
    name: str, version: int, alias: str = CHAMPION, client: MlflowClient | None = None
) -> int | None:
    """Set ``alias`` on ``version`` because a person asked, whatever its perplexity.

    Returns the version that held ``alias`` before (None if none did). For ``champion`` the rule's
    bookkeeping applies: the reason tag says "promoted explicitly" and the previous champion is
    tagged as superseded.
    """
    client = client or MlflowClient(use_tracking())
    try:
        client.get_model_version(name, str(version))
    except MlflowException as err:
        raise ConfigError(f"cannot promote: {err.message}", key="version") from None
    holder = _alias_holder(client, name, alias)
    if alias == CHAMPION:
        previous = None if holder is None else int(holder.version)
        decision = PromotionDecision(CHAMPION, "promoted explicitly", previous)
        _crown(client, name, version, holder, decision)
    else:
        try:
            client.set_registered_model_alias(name, alias, str(version))
        except MlflowException as err:
            raise ConfigError(err.message, key="alias") from None
    return None if holder is None else int(holder.version)


def current_champion(name: str, client: MlflowClient) -> ModelVersion | None:
    """The version holding ``champion``, or None (no such alias, or no such model yet)."""
    return _alias_holder(client, name, CHAMPION)


def decide(candidate: ModelVersion, champion: ModelVersion | None) -> PromotionDecision:
    """The rule itself, on the tags of a new version and of another one holding ``champion``."""
    perplexity = perplexity_of(candidate)
    previous = None if champion is None else int(champion.version)
    if perplexity is None:
        reason = "no heldout perplexity: only an explicit promotion makes it champion"
        return PromotionDecision(CHALLENGER, reason, previous)
    if champion is None:
        reason = f"first champion: heldout perplexity {_perplexity(perplexity)}"
        return PromotionDecision(CHAMPION, reason, None)
    mismatch = _incomparable(candidate, champion)
    if mismatch is not None:
        return PromotionDecision(CHALLENGER, mismatch, previous)
    best = perplexity_of(champion)
    assert best is not None  # _incomparable checked it
    ours, theirs = _perplexity(perplexity, best), _perplexity(best, perplexity)
    if perplexity < best:
        reason = f"heldout perplexity {ours} beats champion v{previous}'s {theirs}"
        return PromotionDecision(CHAMPION, reason, previous)
    relation = "ties" if perplexity == best else "does not beat"
    reason = f"heldout perplexity {ours} {relation} champion v{previous}'s {theirs}"
    return PromotionDecision(CHALLENGER, reason, previous)


def _perplexity(value: float, other: float | None = None) -> str:
    """``value`` to two decimals at most, as the flow's log prints perplexities (``596.21``,
    ``31``), or to six significant digits where two decimals would not tell it from ``other``."""
    rounded = f"{value:.2f}"
    if other is not None and other != value and rounded == f"{other:.2f}":
        return f"{value:.6g}"
    return rounded.rstrip("0").rstrip(".")


def _incomparable(candidate: ModelVersion, champion: ModelVersion) -> str | None:
    """Why the two perplexities cannot be compared, or None when they can."""
    if perplexity_of(champion) is None:
        return f"not comparable: champion v{champion.version} has no heldout perplexity"
    for tag, what, required in COMPARABILITY:
        ours, theirs = candidate.tags.get(tag), champion.tags.get(tag)
        if (ours is None or theirs is None) and not required:
            continue
        if ours is None or ours != theirs:
            return (
                f"not comparable: {what} differs from champion v{champion.version}'s "
                f"({tag} {_short(ours)} vs {_short(theirs)})"
            )
    return None


def perplexity_of(version: ModelVersion) -> float | None:
    """The version's heldout perplexity; None when absent or not a finite positive number."""
    try:
        value = float(version.tags[PERPLEXITY_TAG])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _crown(
    client: MlflowClient,
    name: str,
    version: int,
    champion: ModelVersion | None,
    decision: PromotionDecision,
) -> None:
    """Make ``version`` champion: the decision first (an alias never lacks its why), the old
    champion marked superseded, and ``challenger`` dropped if this version held it (one is not
    both).

    Version numbers are compared as ints: stores return them as ints or strings."""
    _record(client, name, version, decision)
    if champion is not None and int(champion.version) != version:
        client.set_model_version_tag(name, str(champion.version), SUPERSEDED_BY_TAG, str(version))
    challenger = _alias_holder(client, name, CHALLENGER)
    if challenger is not None and int(challenger.version) == version:
        client.delete_registered_model_alias(name, CHALLENGER)
    client.set_registered_model_alias(name, CHAMPION, str(version))


def _record(client: MlflowClient, name: str, version: int, decision: PromotionDecision) -> None:
    """Write ``decision`` on the version, where :func:`recorded_decision` reads it back."""
    for key, value in decision_tags(decision).items():
        client.set_model_version_tag(name, str(version), key, value)


def decision_tags(decision: PromotionDecision) -> dict[str, str]:
    """The tags that record ``decision`` (on the version, and on the run that registered it)."""
    tags = {PROMOTION_ALIAS_TAG: decision.alias, REASON_TAG: decision.reason}
    if decision.previous_champion is not None:
        tags[PREVIOUS_CHAMPION_TAG] = str(decision.previous_champion)
    return tags


def _alias_holder(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    """The version holding ``alias``; None when the alias (or the model) does not exist."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def _short(value: str | None) -> str:
    return "missing" if value is None else value[:12]
