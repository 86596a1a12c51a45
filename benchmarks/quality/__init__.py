"""Quality: the papers' ablations and tables, GLUE against Hugging Face, privacy defences, packing
against unpacked training."""
