"""The run folder's protocol: its names and limits (RunPaths), run.json, safe reads and checkpoint folders.
Read by the launcher and the runtime alike; imports no torch."""
