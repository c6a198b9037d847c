"""Tests of specdraft.search."""
