"""fairseq's real command lines and the plugin's tools end to end: train, resume, distributed,
eval, GLUE, the quickstart, the hydra configs, documented recipes."""
