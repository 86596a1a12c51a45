"""Data: corpus readers, example generation (BERT appendix A), the TFRecord schema, the
resumable tf.data input pipeline (see docs/pretraining_data.md), and for every task the
packed-row layout, packing and length buckets.

Modules (import what you need; nothing is imported here, so `import bert_jax.data` is cheap):
  corpus, sentences, wikitext   documents from original-format/plain text, MediaWiki dumps, TFDS
  examples, masking             instances and static masks (google-research/bert's procedure)
  dynamic_masking               the same masking drawn at read time (NumPy, per batch)
  tfrecord                      the original feature schema, atomic writing, shard integrity
  example_proto                 tf.train.Example serialization without TensorFlow (workers)
  generate                      parallel deterministic generation over input shards
  pipeline                      PretrainInput (training, resumable) and eval_batches
  packing                       the packed-row layout (RowLayout) of every task; first fit over
                                a stream (PackedPretrainInput, resumable), best fit over a set
                                of rows (Packer: a fine-tuning step's, an evaluation split's)
  length_buckets                LengthBucketer: batches cut to the shortest configured length
  default_corpus                prepare_default_data: CPython's own docs as a built-in corpus
"""
