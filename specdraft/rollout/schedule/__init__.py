"""Offline rollout schedules (fifo, verl, asp) and the adaptive-TP planner."""
