"""LaunchPlan: the compiled plan as data. JSON out is deterministic (same spec, byte-identical text)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

SCHEMA_VERSION = 1
_ROW_SECTIONS = ("ranks", "tap_routes")


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything a launch needs; `runtime/` reads it back from plan.json and nothing else."""

    schema_version: int
    specdraft_version: str
    name: str
    spec_sha256: str
    spec: dict
    world_size: int
    parallel: dict
    num_microbatches: int
    ranks: list
    stages: list
    memory: list
    megatron_args: list
    draft: dict
    taps: list
    tap_routes: list
    tap_traffic: dict
    warnings: list
    renders: dict
    rollout: dict

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """Deterministic JSON: field order fixed by the dataclass, keys inside sections as compiled.

        The per-rank and per-route lists are written one compact object per line: readable, diffable, and
        encoded by the C encoder (an indented dump of a 16K-rank plan is 5x slower).
        """
        compact = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode
        parts = []
        for key, value in self.to_dict().items():
            if key in _ROW_SECTIONS and value:
                # One C-encoder call for the whole list, then a line break between rows: rows hold only numbers,
                # booleans and plain names, so "}, {" occurs exactly between rows.
                body = "[\n  " + compact(value)[1:-1].replace("}, {", "},\n  {") + "\n ]"
            else:
                body = json.dumps(value, indent=1, ensure_ascii=True).replace("\n", "\n ")
            parts.append(f" {json.dumps(key)}: {body}")
        return "{\n" + ",\n".join(parts) + "\n}\n"

    @property
    def plan_hash(self) -> str:
        """sha256 of the plan JSON; its first 8 hex digits name the run folder."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaunchPlan":
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data))
        if missing:
            raise ValueError(f"not a specdraft plan: missing {', '.join(missing)}")
        if data["schema_version"] != SCHEMA_VERSION:
            raise ValueError(f"plan schema_version {data['schema_version']} is not {SCHEMA_VERSION}; recompile it")
        return cls(**{k: data[k] for k in names})

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        return cls.from_dict(json.loads(text))
