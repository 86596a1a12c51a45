"""How each family of tasks is run: its Job for the trainer, its config rules, the entry
points' one call (``build_job`` of any run config in ``jobs.py``)."""
