"""Option errors for the rag stages: `llmkit.errors.OptionError` (messages name options as `{name}`,
the CLI spells them as the running command's flags)."""

from llmkit.errors import OptionError

__all__ = ["OptionError"]
