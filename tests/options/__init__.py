"""The stack options (partial heads, global tokens, length scale, learned scales and their pruning,
slope interpolation, hydra position options) and bad options."""
