"""Tests of specdraft.runs."""
