"""Train short, test long on WikiText-2: the quickstart experiment on public text.

    python -m experiments.wikitext2_extrapolation [--wikitext DIR] [--out DIR]
                                                 [quickstart options: --L, --max-update, ...]

WikiText-2's validation split (214k words) is the training text and its test split (241k
words) the evaluation text (only those two splits are at hand; the 2M-word train split is not).
A 2,000-piece sentencepiece BPE model is trained on the training text, both splits are
binarized with ``fairseq-preprocess``, then ``python -m fairseq_alibi.quickstart --data`` trains
the ALiBi and the sinusoidal model at L and evaluates them at L, 2L, 4L and 8L. Perplexities
are per sentencepiece token, so they are not comparable with published word-level WikiText-2
figures; the comparison that matters is between lengths and between the two models.

``DIR`` defaults to ``../shared/data/wikitext-2`` next to the repository (files
``wiki.valid.tokens`` and ``wiki.test.tokens``).
"""

import argparse
import os
import sys
import time
from pathlib import Path

from experiments.lm_runs import DEFAULT_WIKITEXT, wikitext_files
from fairseq_alibi.cli import quickstart

VOCAB = 2000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--wikitext", default=str(DEFAULT_WIKITEXT))
    parser.add_argument("--out", default="outputs/wikitext2-extrapolation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-h", "--help", action="store_true")
    args, rest = parser.parse_known_args(argv)
    if args.help:
        print(__doc__)
        print("Other options go to the quickstart:")
        quickstart.parse_args(["--help"])
    try:
        files = wikitext_files(args.wikitext)
    except SystemExit as missing:
        print(f"{missing} with --wikitext DIR", file=sys.stderr)
        return 2

    out = Path(args.out).resolve()
    started = time.time()
    cores = os.cpu_count() or 1
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(cores)))
    print("[wikitext-2] sentencepiece on wiki.valid.tokens, then fairseq-preprocess ...")
    data = quickstart.prepare_text_data(files, out / "data", VOCAB, env, args.seed)
    print(f"[wikitext-2] data ready in {time.time() - started:.0f} s: {data}")
    return quickstart.main(["--data", str(data), "--out", str(out), "--seed", str(args.seed)]
                           + rest)


if __name__ == "__main__":
    sys.exit(main())
