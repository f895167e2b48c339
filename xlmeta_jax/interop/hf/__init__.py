"""Hugging Face interop: parameter layout, tokenizer files, weight conversion."""
