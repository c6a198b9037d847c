"""The shipped layouts, installed as package data so the built-in default works outside the source tree."""
