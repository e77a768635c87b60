"""The names the registry writes: the models' names, their tags and their versions' tags.

Writers and readers import the names from here, so none imports another's module for a string.
"""

from __future__ import annotations

from pipelines.common.handoff import CHECKPOINT_TAG, DATASET_TAG

DEFAULT_NAME = "elmo-bilm"
CHAMPION = "champion"  # the alias of the version users get (the champion policy sets it)

# On a registered model (the same for all its versions): what a user filters the model list on.
KIND_TAG = "elmo.kind"  # "bilm" or "task"
TASK_TAG = "elmo.task"  # elmo-<task> models (and their versions and adapt runs): the task
# On a task model version: the seeds its scores are the mean over, and the one whose weights it is.
SEEDS_TAG = "elmo.seeds"
WEIGHTS_SEED_TAG = "elmo.weights_seed"

# What registration records on a biLM version (strings, as MLflow stores them).
FORWARD_PERPLEXITY_TAG = "elmo.perplexity.forward"
BACKWARD_PERPLEXITY_TAG = "elmo.perplexity.backward"
PERPLEXITY_TAG = "elmo.perplexity"  # geometric mean: exp(mean(½(CE_f + CE_b)))
HELDOUT_HASH_TAG = "elmo.heldout_hash"
HELDOUT_SPLIT_TAG = "elmo.heldout_split"
PREDICTED_TOKENS_TAG = "elmo.heldout_predicted_tokens"  # each sentence's words and its end
PROTOCOL_TAG = "elmo.perplexity_protocol"
VOCAB_HASH_TAG = "elmo.vocab_sha256"
MANIFEST_HASH_TAG = "elmo.manifest_sha256"
BILM_TF_TAG = "elmo.bilm_tf"
PRESET_TAG = "elmo.preset"  # the preset whose architecture it has, or "custom"
SIZE_TAG = "elmo.size"  # <LSTM layers>x<cells>_<projection>, as the released models are named
TRAIN_RUN_TAG = "elmo.train_run_id"  # the training run; also on the register run
EVALUATE_RUN_TAG = "elmo.evaluate_run_id"  # the perplexities' run; also on the register run
REGISTER_RUN_TAG = "elmo.register_run_id"  # the run that registered the version
# Which model of its training run a version is, and its step: pipelines.common.handoff's
# CHECKPOINT_TAG and CHECKPOINT_STEP_TAG (also on the evaluate and register runs).

# The tags a biLM version keeps (what a user filters versions on, and what the champion policy
# and a re-registration read back); registration writes every other one onto the register run,
# and says it in the version's description.
BILM_VERSION_TAGS = frozenset(
    {
        PERPLEXITY_TAG,
        HELDOUT_HASH_TAG,
        PROTOCOL_TAG,
        VOCAB_HASH_TAG,
        DATASET_TAG,
        PRESET_TAG,
        SIZE_TAG,
        BILM_TF_TAG,
        TRAIN_RUN_TAG,
        REGISTER_RUN_TAG,
        CHECKPOINT_TAG,
    }
)

# What the champion policy records: its decision (alias, reason, the champion it was measured
# against) and, on a dethroned champion, its successor. The register run carries the same tags.
PROMOTION_ALIAS_TAG = "elmo.promotion_alias"
REASON_TAG = "elmo.promotion_reason"
PREVIOUS_CHAMPION_TAG = "elmo.promotion_previous_champion"
SUPERSEDED_BY_TAG = "elmo.superseded_by"


def score_tag(split: str, metric: str) -> str:
    """``elmo.test_f1``: a task model version's main score on test (dev when it has no test),
    the mean over its seeds."""
    return f"elmo.{split}_{metric}"


def sd_tag(split: str, metric: str) -> str:
    """``elmo.test_f1_sd``: that score's sample standard deviation over the seeds."""
    return f"{score_tag(split, metric)}_sd"


def gain_tag(split: str, metric: str) -> str:
    """``elmo.gain.test_f1``: the mean score minus the baseline's mean (what ELMo brought)."""
    return f"elmo.gain.{split}_{metric}"
