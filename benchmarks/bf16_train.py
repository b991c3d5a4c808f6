"""``fairseq-train`` in bf16 on a GPU: ``python -m benchmarks.bf16_train`` + fairseq-train's flags.

Stock ``fairseq-train --bf16`` sets ``--tpu`` (fairseq/options.py: "use bfloat16; implies
--tpu"), so on a GPU without torch_xla it fails before training. This is fairseq-train's own
``main`` with that one flag unset again: what ``fairseq-hydra-train common.bf16=true`` trains
(the model cast to bf16, fairseq's FP16Optimizer keeping a float32 master copy, no loss scaling).
"""

import sys


def cli_main(argv=None):
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli.train import main

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       input_args=argv if argv is not None else sys.argv[1:])
    if not args.bf16:
        raise SystemExit("benchmarks.bf16_train: pass --bf16 (otherwise use fairseq-train)")
    args.tpu = False
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), main)


if __name__ == "__main__":
    cli_main()
