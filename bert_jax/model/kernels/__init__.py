"""How the model's operations are computed, apart from what they compute (``bert_jax.model.bert``):
attention kernels chosen by ``BertConfig.attention_kernel``, and the forms of products, dropout,
LayerNorm and softmax that XLA:CPU runs fast, picked per platform when lowering."""
