"""Non-linguistic supervision (VisualCSE/AudioCSE): unpaired images or audio through the student.

:mod:`patch_embed` turns images / log-mel spectrograms into tokens, :mod:`augment` makes image
views on the device, :mod:`fbank` computes Kaldi-compatible filterbanks without torchaudio
(Stage 1), and :mod:`task` is the image/audio task whose update the trainer runs before each
text update (:mod:`mmcse.training.updates`). Stage 1 writes the examples with :mod:`pipeline.nonling_cache`.
"""

from mmcse.nonling.task import (
    AUDIO_KIND,
    IMAGE_KIND,
    NonLinguisticSettings,
    NonLinguisticTask,
    class_of,
    encode_tokens,
)

__all__ = [
    "AUDIO_KIND",
    "IMAGE_KIND",
    "NonLinguisticSettings",
    "NonLinguisticTask",
    "class_of",
    "encode_tokens",
]
