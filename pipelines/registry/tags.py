"""The names the registry writes: the model's name and the tags of its versions.

Registration writes the evaluation and dataset tags; the champion policy reads them and writes
the promotion tags. Both import their names from here, so neither imports the other's module for
a string (docs/registry.md explains each tag).
"""

from __future__ import annotations

DEFAULT_NAME = "elmo-bilm"

# What registration records on a version (strings, as MLflow stores them).
FORWARD_PERPLEXITY_TAG = "elmo.perplexity.forward"
BACKWARD_PERPLEXITY_TAG = "elmo.perplexity.backward"
PERPLEXITY_TAG = "elmo.perplexity"  # geometric mean: exp(mean(½(CE_f + CE_b)))
HELDOUT_HASH_TAG = "elmo.heldout_hash"
HELDOUT_SPLIT_TAG = "elmo.heldout_split"
HELDOUT_TOKENS_TAG = "elmo.heldout_tokens"
PROTOCOL_TAG = "elmo.perplexity_protocol"
VOCAB_HASH_TAG = "elmo.vocab_sha256"
MANIFEST_HASH_TAG = "elmo.manifest_sha256"
DATASET_TAG = "elmo.dataset"
BILM_TF_TAG = "elmo.bilm_tf"

# What the champion policy records: its decision (alias, reason, the champion it was measured
# against) and, on a dethroned champion, its successor.
PROMOTION_ALIAS_TAG = "elmo.promotion_alias"
REASON_TAG = "elmo.promotion_reason"
PREVIOUS_CHAMPION_TAG = "elmo.promotion_previous_champion"
SUPERSEDED_BY_TAG = "elmo.superseded_by"
