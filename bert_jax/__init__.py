"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax, sharded over device meshes."""

__version__ = "0.1.0"
