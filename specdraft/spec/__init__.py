"""Layout spec: schema, loading (YAML + dotlist overrides) and validation. Imports no torch."""
