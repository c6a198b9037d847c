"""Checkpoint folders a layout names, read when it loads (no torch): the policy's Hugging Face config.json
(`hf_config`) and the EAGLE-3 draft that draft.path starts from (`draft`)."""
