"""Hugging Face checkpoints in and out of the runtime's policy: the name and layout mapping (mapping.py), the folder
and its safetensors headers checked without torch (checkpoint.py), per-rank slice reads (reader.py, load.py) and the
policy written back as a HF folder (export.py)."""
