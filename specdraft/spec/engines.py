"""The rollout engine kinds: grpo.engine's Literal (spec/schema.py) is their one listing, read here for
`rollout measure --engine`; runtime/rl/engine.py's ENGINES registry builds each (a unit test keeps the two equal)."""

from __future__ import annotations

import typing

from specdraft.spec.rl import GrpoSpec

ENGINE_KINDS: tuple[str, ...] = typing.get_args(typing.get_type_hints(GrpoSpec)["engine"])
