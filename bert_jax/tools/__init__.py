"""What runs a trained encoder besides fine-tuning: feature extraction, next-token
prediction, the privacy probe."""
