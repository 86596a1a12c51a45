"""The fine-tuning run every Task shares: train, evaluate, predict; its batches and rules."""
