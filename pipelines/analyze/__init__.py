"""The analyze stage: the paper's §5 analyses of a biLM (``elmo analyze``)."""
