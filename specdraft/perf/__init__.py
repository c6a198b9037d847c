"""The estimated step time of a layout (used by search): per-microbatch costs, locality and the pipeline model."""
