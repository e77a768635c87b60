"""The evaluate stage: full-softmax perplexity of a biLM on heldout shards (``evaluate.stage``)."""
