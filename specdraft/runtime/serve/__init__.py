"""What serves the trained draft: offline loading, the EAGLE-3 export, lossless speculative decoding and
its measurement."""
