"""Ring attention with the EAGLE-3 branch merge: a zigzag CP ring over the trunk K/V, rank-local branch keys
merged by log-sum-exp. Reference and fused kernels, backend choice, halo shifts, and the one megatron
core-attention adapter (megatron_core.py)."""
