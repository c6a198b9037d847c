"""Tests of specdraft.plan."""
