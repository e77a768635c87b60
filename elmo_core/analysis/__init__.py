"""The paper's §5 analyses of a biLM's layers: what each holds, how much labelled data it saves."""
