"""llmkit.kv (library layer; filled in by its own issue)."""
