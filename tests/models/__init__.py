"""The language model and the encoder in process (alibi_transformer_lm, alibi_roberta, compact
models), inputs of unusual shape, the hub."""
