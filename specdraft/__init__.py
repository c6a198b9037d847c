"""specdraft: plan, validate and launch RL post-training with an online co-trained EAGLE-3 draft."""

__version__ = "0.1.0"
