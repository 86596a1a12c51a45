"""The pre-training run: its Job (curriculum, schedule, evaluation) and its config rules."""
