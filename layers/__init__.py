"""The transformer: Llama-3 / Qwen3 decoder layers and attention kernels, knowing nothing about scoring."""
