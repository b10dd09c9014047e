"""Model definitions (Llama family) and checkpoint loaders.

`llama.Llama` is the decoder (Flax linen) the engine's programs run; `llama_config.LlamaConfig`
its hyper-parameters, presets (`PRESETS`) and the Hugging Face config.json mapping;
`hf_loader` loads a local Hugging Face checkpoint, `orbax_checkpoint` pdjax's own format.
"""
