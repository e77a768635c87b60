"""The embed stage: a corpus or task dataset → ELMo vectors per sentence (``embed.stage``)."""
