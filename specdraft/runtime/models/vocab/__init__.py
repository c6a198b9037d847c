"""The draft's vocabulary: the reduced mapping (d2t/t2d) and vocab-parallel softmax statistics."""
