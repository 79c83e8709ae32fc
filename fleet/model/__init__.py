"""Model facts: prompts rendered by the model's own files, context and output length, GPU capacity, identity."""
