from fairseq_alibi.models import alibi_transformer_lm  # noqa: F401
from fairseq_alibi.models import alibi_roberta  # noqa: F401
from fairseq_alibi.models import alibi_transformer  # noqa: F401
from fairseq_alibi.models.checks import refuse_unconverted_fork_checkpoints

refuse_unconverted_fork_checkpoints()  # after the mirrors above: the forks' names stay unmirrored
