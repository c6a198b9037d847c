"""Tests of specdraft.render."""
