"""One rank's training step: trainer, batches, data, TapChannel, gradients, precision, metrics, checkpoints
and preemption."""
