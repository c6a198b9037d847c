"""Tests of specdraft.runtime."""
