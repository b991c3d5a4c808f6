from .alibi_multihead_attention import AlibiMultiheadAttention, set_attention_backend  # noqa: F401
from .alibi_transformer_layer import (  # noqa: F401
    AlibiTransformerDecoderLayer,
    AlibiTransformerEncoderLayer,
    CrossPositionDecoderLayer,
    wrap_layer,
)
