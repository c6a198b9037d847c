"""Tests of specdraft.spec."""
