"""The biLM and ELMo modules (single-device model code only)."""
