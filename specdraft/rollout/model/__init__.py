"""The rollout side's cost model: instances, decode-step costs, profiles, the training-side estimate,
workloads and measured acceptance."""
