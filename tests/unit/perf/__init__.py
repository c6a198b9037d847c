"""Tests of specdraft.perf."""
