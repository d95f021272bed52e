"""What a run keeps: checkpoints and their manifests, readable samples, and the weight-sync check
that the rollout engine holds the trainer's weights."""
