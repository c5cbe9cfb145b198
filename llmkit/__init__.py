"""llmkit: composable command-line tools for running LLMs on your own machine."""

__version__ = "0.1.0"
