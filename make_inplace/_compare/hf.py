"""The main job's rows for Hugging Face models: they live with the model presets
(make_inplace.hf.compare); none without transformers."""

from make_inplace.hf.compare import rows

__all__ = ["rows"]
