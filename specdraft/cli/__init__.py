"""CLI: thin typer commands over spec/plan/render/execute, with one error boundary."""
