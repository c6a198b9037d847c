"""Field-level rules of a layout, one module per section (parallel, model, data, grpo, run, container); `fields`
runs them all and collects every problem at once."""

from specdraft.spec.validate.fields import validate_fields

__all__ = ["validate_fields"]
