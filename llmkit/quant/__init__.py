"""llmkit.quant (library layer; filled in by its own issue)."""
