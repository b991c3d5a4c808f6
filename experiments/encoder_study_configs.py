"""The encoder study's configurations (:data:`CONFIGS`), its size and budget (:class:`Settings`)
and its steps: what ``python -m experiments.encoder_study`` runs and its report reads."""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"
GLUE_TASKS = ("CoLA", "SST-2", "STS-B")
#: --smoke: the baseline and the default variant, a classification and a regression task
SMOKE_CONFIGS = ("learned", "offset")
#: the tasks the long-input comparison uses (CoLA's sentences are short)
LONG_TASKS = ("SST-2", "STS-B")
STEPS = ("prepare", "pretrain", "mlm", "glue", "long", "reach", "report")


@dataclass(frozen=True)
class Config:
    """One row of the study: how it is pretrained and fine-tuned."""

    label: str
    pretrain: Sequence[str] = ()  # flags of fairseq-train --task masked_lm (after the sizes)
    finetune: Sequence[str] = ()  # extra flags of its fine-tuning runs
    checkpoint_of: Optional[str] = None  # fine-tunes that configuration's pretrained model
    glue: bool = True
    long: bool = False
    note: str = ""
    length_scale: bool = False  # masked-LM scored with --alibi-length-scale L (no retraining)

    @property
    def sinusoidal(self):
        return SINUSOIDAL_FLAG in list(self.pretrain)

    @property
    def learned_positions(self):
        return "none" in list(self.pretrain) and not self.sinusoidal


#: the study's own flag of fairseq-train (:func:`fairseq_train_sinusoidal`): stock RoBERTa with
#: sinusoidal positions, which its architecture hard-codes as learned (no flag for it)
SINUSOIDAL_FLAG = "--sinusoidal-positions"
WHY_NO_SINUSOIDAL_GLUE = (
    "masked-LM only: stock RoBERTa's architecture sets `encoder_learned_pos = True` with no "
    "flag for it, so the study pretrains it through fairseq-train's own `cli_main` with one "
    f"added flag ({SINUSOIDAL_FLAG}); `fairseq-alibi glue` fine-tunes with the flags stock "
    "fairseq-train knows, which cannot rebuild it")

#: every configuration of the study; the order is the order of the tables
CONFIGS: Dict[str, Config] = {
    "learned": Config("learned positions (stock RoBERTa)", ["--alibi-variant", "none"]),
    "sinusoidal": Config("sinusoidal positions (stock RoBERTa, encoder_learned_pos false)",
                         ["--alibi-variant", "none", SINUSOIDAL_FLAG], glue=False,
                         note=WHY_NO_SINUSOIDAL_GLUE),
    "offset": Config("offset", ["--alibi-variant", "offset"], long=True),
    "zero_clap": Config("zero-CLAP (offset, CLAP head, zero <mask>)",
                        ["--alibi-variant", "offset", "--mlm-head", "clap",
                         "--zero-mask-embedding"], long=True),
    "symmetric": Config("symmetric", ["--alibi-variant", "symmetric"]),
    "one_sided": Config("one_sided", ["--alibi-variant", "one_sided"]),
    "asymmetric": Config("asymmetric (learned future slopes)",
                         ["--alibi-variant", "asymmetric", "--alibi-learnable-future-slopes"]),
    "learned_scales": Config("offset, learned per-head slope scales",
                             ["--alibi-variant", "offset", "--alibi-learned-scales", "per_head"],
                             glue=False, note="masked-LM only: a pretraining option, measured "
                             "for length (the GLUE grid is the baseline, the plain variants, "
                             "zero-CLAP and the bias and pooler options)"),
    "steep_slopes": Config("offset, slopes × 4 (fixed)",
                           ["--alibi-variant", "offset", "--alibi-scale-init", "4"], glue=False,
                           note="masked-LM only: whether steeper slopes (less context from far "
                           "away) keep the perplexity from rising beyond L"),
    # the bias and pooler options; a checkout without them skips these rows (and says so)
    "global_token": Config("offset, global first token", ["--alibi-variant", "offset",
                                                          "--alibi-global-tokens", "1"],
                           long=True),
    "partial_heads": Config("offset, ALiBi on half the heads",
                            ["--alibi-variant", "offset", "--alibi-heads", "2"], long=True),
    "mean_pooler": Config("offset, mean pooler", finetune=["--classification-pooler", "mean"],
                          checkpoint_of="offset", long=True),
    "zero_clap_mean": Config("zero-CLAP, mean pooler", finetune=["--classification-pooler",
                                                                 "mean"],
                             checkpoint_of="zero_clap", long=True),
    "offset_length_scale": Config(
        "offset, slopes × log N / log L beyond L (`--alibi-length-scale L`)",
        checkpoint_of="offset", length_scale=True, glue=False,
        note="masked-LM only: an evaluation option of the offset model (no retraining); at L "
        "and below it computes what offset computes, GLUE inputs cut to L included"),
    "zero_clap_length_scale": Config(
        "zero-CLAP, slopes × log N / log L beyond L (`--alibi-length-scale L`)",
        checkpoint_of="zero_clap", length_scale=True, glue=False,
        note="masked-LM only: an evaluation option of the zero-CLAP model (no retraining)"),
    "combination": Config("offset + global token + half the heads + mean pooler (planned)",
                          ["--alibi-variant", "offset", "--alibi-global-tokens", "1",
                           "--alibi-heads", "2"], finetune=["--classification-pooler", "mean"],
                          long=True),
}
#: configurations that cannot run at all here, and why
SKIPPED: Dict[str, str] = {}
BASELINE = "learned"


# ------------------------------------------------------------------------------ the settings


@dataclass
class Settings:
    """Size, data and budget, the same for every configuration."""

    layers: int = 4
    dim: int = 128
    heads: int = 4
    ffn: int = 512
    vocab: int = 8000
    L: int = 32
    batch: int = 32  # sequences per pretraining update
    max_tokens: Optional[int] = None  # tokens per update instead of `batch` blocks, if set
    updates: int = 3000
    lr: float = 1e-3
    warmup: int = 300
    heldout_lines: Optional[int] = None  # of WikiText-2's test split (None: all)
    mlm_seeds: Sequence[int] = (1, 2, 3)
    lengths: Sequence[int] = (1, 2, 4, 8)  # × L
    sst2_train: int = 8000  # SST-2 training subset (random, fixed)
    glue_rows: Optional[int] = None  # every task's train and dev cut to this (smoke only)
    glue_tasks: Sequence[str] = GLUE_TASKS
    glue_seeds: Sequence[int] = (1, 2, 3, 4, 5)
    glue_lr: float = 3e-4
    glue_epochs: int = 3
    reach_inputs: int = 256


SMOKE = Settings(layers=1, dim=32, heads=4, ffn=64, vocab=400, L=16, batch=8, updates=6,
                 lr=1e-3, warmup=2, heldout_lines=40, mlm_seeds=(1,), lengths=(1, 2),
                 sst2_train=48, glue_rows=48, glue_tasks=("SST-2", "STS-B"), glue_seeds=(1,),
                 glue_epochs=1, reach_inputs=16)


def model_flags(s: Settings) -> List[str]:
    return ["--arch", "alibi_roberta_base", "--encoder-layers", str(s.layers),
            "--encoder-embed-dim", str(s.dim), "--encoder-ffn-embed-dim", str(s.ffn),
            "--encoder-attention-heads", str(s.heads)]
