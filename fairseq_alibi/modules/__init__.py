"""The layers: the stacks' bias (:mod:`.bias`), the attention backends (:mod:`.attention`), the
ALiBi attention and transformer layers, the stacks the models build (:mod:`.stacks`), the
cross-attention position options, the CLAP head and the compact modules. Import from the
submodules (this package imports none of them, so that importing one stays cheap)."""
