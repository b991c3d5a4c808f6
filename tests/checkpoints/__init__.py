"""Checkpoints from elsewhere: saved before the redesign, the two ALiBi forks (converted or not),
stock LMs converted, Hugging Face, the wrong kind."""
