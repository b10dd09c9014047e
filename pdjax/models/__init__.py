"""Model definitions (Llama family) and checkpoint loaders."""
