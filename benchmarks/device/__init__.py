"""Runs on an accelerator: the device check and the attention kernels' compiles."""
