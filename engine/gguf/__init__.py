"""GGUF checkpoints: read (`reader`), dequantize (`dequant`), tokenizer from metadata
(`tokenizer`), and the once-per-file HF-format view the loader serves from (`convert`).
"""
