"""llmkit.rag (library layer; filled in by its own issue)."""
