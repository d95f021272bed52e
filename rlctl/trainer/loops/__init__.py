"""The loop: one driver loop over the stages (``sync.py``) for every ``trainer.mode``, given a
rollout source (``source.py``: colocated, or a pipeline ahead of the trainer), and stopping a
run without losing it."""
