"""Pre-training data: corpus readers, example generation (BERT appendix A), the TFRecord schema,
and the resumable tf.data input pipeline. See docs/pretraining_data.md.

Modules (import what you need; nothing is imported here, so `import bert_jax.data` is cheap):
  corpus, sentences, wikitext   documents from original-format/plain text, MediaWiki dumps, TFDS
  examples, masking             instances and static masks (google-research/bert's procedure)
  dynamic_masking               the same masking drawn at read time (NumPy, per batch)
  tfrecord                      the original feature schema, atomic writing, shard integrity
  example_proto                 tf.train.Example serialization without TensorFlow (workers)
  generate                      parallel deterministic generation over input shards
  pipeline                      PretrainInput (training, resumable) and eval_batches
  packing                       PackedPretrainInput: several instances per row (resumable)
  default_corpus                prepare_default_data: CPython's own docs as a built-in corpus
"""
