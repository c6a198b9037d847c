"""Discrete-event rollout simulation: one instance, the event queue, the asynchronous simulator and
synchronous generation."""
