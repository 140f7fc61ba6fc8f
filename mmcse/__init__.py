"""mmcse: multimodal contrastive learning of sentence embeddings (Stage 2: the trainer library).

Importable without the CLI or the Stage-1 pipeline.
"""

__version__ = "0.1.0"
