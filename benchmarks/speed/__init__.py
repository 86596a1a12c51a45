"""Throughput: pre-training and fine-tuning steps, the MLM head, masking, packing, the input
pipeline, tokenizers, pre-training data generation."""
