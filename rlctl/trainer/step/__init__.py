"""Driver-side stages of an RL step that need no worker: rewards as token scores, KL penalty,
advantages, batch metrics, and the mini-batch layout of an update."""
