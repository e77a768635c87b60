"""Text → tokens, vocabularies and character ids."""
