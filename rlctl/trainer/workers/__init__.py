"""The SPMD programs of each role (policy with its colocated rollout engine, reference, critic,
disaggregated rollout) and the loss closures they hand to the training engine."""
