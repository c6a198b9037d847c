"""Tests of specdraft.cli."""
