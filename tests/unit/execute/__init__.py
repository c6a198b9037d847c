"""Tests of specdraft.execute."""
