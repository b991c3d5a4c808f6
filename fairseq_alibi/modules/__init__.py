from .alibi_multihead_attention import AlibiMultiheadAttention  # noqa: F401
from .alibi_transformer_layer import (  # noqa: F401
    AlibiTransformerDecoderLayer,
    AlibiTransformerEncoderLayer,
    wrap_layer,
)
