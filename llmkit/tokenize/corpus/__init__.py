"""A tokenizer over whole inputs: encoding streams in chunks on threads (`stream`), token counts of
files, trees and globs (`count`), a text cut or split at a token budget (`budget`) and corpus
statistics (`stats`).

Works through a loaded `tokenizer.Tokenizer`'s methods: may import llmkit.errors, llmkit.io,
llmkit.config, llmkit.walk and llmkit.plot; never the algorithms, `training` or `formats`.
"""
