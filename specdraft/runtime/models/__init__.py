"""The models the runtime trains: the target (megatron GPTModel chunks), the EAGLE-3 draft, norms, MoE and
the draft vocabulary."""
