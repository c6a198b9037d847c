"""Jinja2 templates of rendered scripts (sbatch), installed as package data."""
