"""Thin CLI modules: parse arguments, call one library function, emit the result."""
