"""pretraining"""
