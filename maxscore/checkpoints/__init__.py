"""Checkpoints: self-describing Orbax directories, Hugging Face and GGUF conversion, export back to transformers,
tokenizers."""

from maxscore.checkpoints.convert import convert_gguf_checkpoint, convert_hf_checkpoint
from maxscore.checkpoints.export import ExportError, export_hf_checkpoint
from maxscore.checkpoints.hf_config import ConversionError
from maxscore.checkpoints.storage import CheckpointError, read_metadata, restore_checkpoint, save_checkpoint
from maxscore.checkpoints.tokenizer import Tokenizer, load_tokenizer

__all__ = ["CheckpointError", "ConversionError", "ExportError", "Tokenizer", "convert_gguf_checkpoint",
           "convert_hf_checkpoint", "export_hf_checkpoint", "load_tokenizer", "read_metadata", "restore_checkpoint",
           "save_checkpoint"]
