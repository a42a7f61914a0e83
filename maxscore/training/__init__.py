"""Fine-tuning: LoRA adapters (lora.py); the shared trainer lands beside it."""
