"""VisualCSE and AudioCSE: SimCSE plus a contrastive task on unpaired images or audio.

Jian et al., *Non-Linguistic Supervision for Contrastive Learning of Sentence Embeddings*
(NeurIPS 2022): ℒ = ℒ_text + ω·ℒ_image (eq. 1), optimised alternately (Algorithm 1) with one
optimizer per task. The text part is SimCSE unchanged (these classes inherit its terms); the
non-linguistic part is :class:`mmcse.nonling.task.NonLinguisticTask`, whose update the trainer
runs before every text update (:meth:`auxiliary_task`; :mod:`mmcse.training.updates`). Its
examples come from Stage 1 (``mmcse extract-image-tensors`` / ``mmcse extract-audio``) and are passed as
``--feature image_tensor=DIR`` or ``--feature audio_fbank=DIR``.

Defaults are the BERT-base settings: batch 48, τ = 0.07, image lr 1e-6 / audio lr 2e-7
(Table C.1) and the objective of the published runs: the paper names SupCon, but every released
command passes ``--new_supcon`` with ``SupCon``, a cross-entropy over the cross-view cosines whose
target is the rank of the example's class among the batch's classes
(:class:`~mmcse.losses.class_rank_cross_entropy.ClassRankCrossEntropyLoss`,
``image_objective`` / ``audio_objective`` = ``"class_rank_cross_entropy"``); ``"supcon"``
(Khosla et al.'s SupCon, the code without ``--new_supcon``) and ``"simclr"`` (the ablation's) are
the switches. ω is not in the paper — 0.05 (images) and 0.01 (audio) are the values of the
authors' released BERT-base commands (their READMEs). RoBERTa-base: Table C.1 gives image lr
5e-7 and audio 2e-7; the VisualCSE README command runs image lr 1e-7 with ω = 0.2 (and prints
the Table 1 row), the AudioCSE README command audio lr 2e-7 (= Table C.1) with ω = 0.02. The
recipes follow one source each (:mod:`mmcse.recipes.catalogue`).

The image (audio) optimizer is the released one: AdamW over every parameter of the model (the
encoder, the text heads, the task's heads; ``image_optimizer_scope="model"``), its gradients
cleared as the run's ``zero_grad`` says (the released ``model.zero_grad()`` zeroes them: a
parameter the image loss does not reach then steps on a zero gradient, i.e. is only decayed, at
``image_weight_decay`` > 0). ``image_optimizer_scope="task"`` covers the encoder and the task's
heads only. At weight decay 0 (every released command and recipe) both give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmcse.errors import MmcseError
from mmcse.methods.simcse import SimCSE
from mmcse.nonling.task import (
    AUDIO_KIND,
    IMAGE_KIND,
    OBJECTIVES,
    OPTIMIZER_SCOPES,
    NonLinguisticSettings,
    NonLinguisticTask,
)
from mmcse.registry import register_method


class NonLinguisticMixin:
    """The trainer hook shared by VisualCSE and AudioCSE."""

    name: ClassVar[str]
    #: the ``--feature`` role (= cache kind) holding the non-linguistic examples
    nonlinguistic: ClassVar[str]

    def nonlinguistic_settings(self) -> NonLinguisticSettings:  # pragma: no cover - abstract
        raise NotImplementedError

    def auxiliary_task(self, encoder: Any, cfg: Any, device: Any) -> NonLinguisticTask | None:
        settings = self.nonlinguistic_settings()
        if settings.weight == 0:  # ablation: plain SimCSE
            return None
        path = cfg.features.get(self.nonlinguistic)
        if not path:
            raise MmcseError(
                f"method {self.name!r} needs its examples: give --feature {self.nonlinguistic}=DIR"
            )
        return NonLinguisticTask(
            encoder, self, path, device, seed=cfg.seed, precision=cfg.precision
        )

    def auxiliary_roles(self) -> tuple[str, ...]:
        return (self.nonlinguistic,) if self.nonlinguistic_settings().weight != 0 else ()

    def describe(self) -> str:
        s = self.nonlinguistic_settings()
        line = (
            f"  {s.weight:g} × {s.modality} {s.objective} (own AdamW lr {s.lr:g}, batch "
            f"{s.batch_size}, --feature {self.nonlinguistic}=DIR), stepped before each text step"
        )
        return "\n".join([super().describe(), line])


@register_method("visualcse")
@dataclass
class VisualCSE(NonLinguisticMixin, SimCSE):
    """SimCSE + a contrastive task on augmented views of unpaired labelled images (ViT patches).

    ``image_objective``: ``"class_rank_cross_entropy"`` (default: the released ``--new_supcon``
    path, ``VisualCSE/src/trainers.py`` ``new_SupCon_forward``, which produced the published
    numbers), ``"supcon"`` (the paper's SupCon, Khosla et al.) or ``"simclr"``.
    """

    name: ClassVar[str] = "visualcse"
    nonlinguistic: ClassVar[str] = IMAGE_KIND
    image_weight: float = 0.05
    image_lr: float = 1e-6
    image_batch_size: int = 48
    image_temperature: float = 0.07
    image_objective: str = OBJECTIVES[0]  # the released --new_supcon objective
    image_weight_decay: float = 0.0
    #: released: the image optimizer covers every model parameter (``trainers.py``)
    image_optimizer_scope: str = OPTIMIZER_SCOPES[0]
    image_size: int = 224
    vit_init: str = "auto"  # auto: in21k ViT of the student's width if any; random; or a dir/id

    def __post_init__(self) -> None:
        self.nonlinguistic_settings()  # validates the fields now, not at the first step

    def nonlinguistic_settings(self) -> NonLinguisticSettings:
        return NonLinguisticSettings(
            kind=IMAGE_KIND,
            weight=self.image_weight,
            lr=self.image_lr,
            batch_size=self.image_batch_size,
            temperature=self.image_temperature,
            objective=self.image_objective,
            weight_decay=self.image_weight_decay,
            optimizer_scope=self.image_optimizer_scope,
            image_size=self.image_size,
            init=self.vit_init,
        )


@register_method("audiocse")
@dataclass
class AudioCSE(NonLinguisticMixin, SimCSE):
    """SimCSE + a contrastive task on dropout views of unpaired labelled audio (log-mel patches).

    ``audio_objective``: ``"class_rank_cross_entropy"`` (default: the released ``--new_supcon``
    path, ``AudioCSE/src/trainers.py`` ``new_SupCon_forward``, speakers as classes),
    ``"supcon"`` or ``"simclr"``.

    ``audio_freq_mask`` / ``audio_time_mask``: the released loader's SpecAugment (one
    frequency mask ≤ 48 bins and one time mask ≤ 192 frames per clip, shared by both views;
    :mod:`mmcse.nonling.specaugment`); 0 and 0 = the paper's reading (dropout views only). The
    released loader's waveform mixup (rate 0.5) is not reproducible from cached fbanks
    (docs/fidelity.md, audio views).

    ``audio_position_embeddings``: False (default) = the released audio path, which adds no
    position embeddings (``AudioCSE/src/models.py:397–400``: patch_embed, cls_token, pos_drop);
    True adds learned ones (the paper's "embedding layer of SSAST").
    """

    name: ClassVar[str] = "audiocse"
    nonlinguistic: ClassVar[str] = AUDIO_KIND
    audio_weight: float = 0.01
    audio_lr: float = 2e-7
    audio_batch_size: int = 48
    audio_temperature: float = 0.07
    audio_objective: str = OBJECTIVES[0]  # the released --new_supcon objective
    audio_weight_decay: float = 0.0
    #: released: the audio optimizer covers every model parameter (``trainers.py``)
    audio_optimizer_scope: str = OPTIMIZER_SCOPES[0]
    audio_patch_size: int = 24  # the paper's 211 tokens; SSAST's own patches are 16
    audio_freq_mask: int = 48  # released: torchaudio FrequencyMasking(48)
    audio_time_mask: int = 192  # released: torchaudio TimeMasking(192)
    audio_position_embeddings: bool = False  # released: none (models.py:397–400)

    def __post_init__(self) -> None:
        self.nonlinguistic_settings()

    def nonlinguistic_settings(self) -> NonLinguisticSettings:
        return NonLinguisticSettings(
            kind=AUDIO_KIND,
            weight=self.audio_weight,
            lr=self.audio_lr,
            batch_size=self.audio_batch_size,
            temperature=self.audio_temperature,
            objective=self.audio_objective,
            weight_decay=self.audio_weight_decay,
            optimizer_scope=self.audio_optimizer_scope,
            patch_size=self.audio_patch_size,
            freq_mask=self.audio_freq_mask,
            time_mask=self.audio_time_mask,
            position_embeddings=self.audio_position_embeddings,
        )
