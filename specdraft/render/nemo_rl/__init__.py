"""NeMo-RL render: overrides for the named NeMo-RL profile (profile.py), its refusals and the fields it does not
carry (rules.py), and their text (text.py)."""

from specdraft.render.nemo_rl.overrides import nemo_rl_overrides
from specdraft.render.nemo_rl.profile import NAME as PROFILE
from specdraft.render.nemo_rl.rules import not_carried, refusals
from specdraft.render.nemo_rl.text import render_text, to_dotlist, to_yaml

__all__ = ["PROFILE", "nemo_rl_overrides", "not_carried", "refusals", "render_text", "to_dotlist", "to_yaml"]
