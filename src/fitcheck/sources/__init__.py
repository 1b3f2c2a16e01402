"""Where a model comes from: a size string, a preset, a Hugging Face config or safetensors headers."""
