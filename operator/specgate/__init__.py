"""specgate: safe rollouts of speculative decoding on vLLM."""

__version__ = "0.2.0"
