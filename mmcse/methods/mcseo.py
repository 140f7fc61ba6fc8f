"""MCSEO: MCSE plus object–phrase alignment (Zhao, Miao & Tsuruoka, 2025).

ℓ_i = ℓ_i^text + α·ℓ_i^img-cap + β·ℓ_i^obj-phra (eq. 8), α = 0.01 (MCSE's best), β = 0.005 (grid
search, §4.1), batch 64, max length 32, τ = 0.05 everywhere, longest caption per image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmcse.losses.heads import HIDDEN, Head
from mmcse.methods.base import BatchInputs, HostBatch, RunData, Term
from mmcse.methods.phrases import PhraseIndex, table_of
from mmcse.methods.simcse import MCSE
from mmcse.registry import register_method


@register_method("mcseo")
@dataclass
class MCSEO(MCSE):
    """SimCSE + α·MCSE image–caption + β·object–phrase InfoNCE (eq. 8).

    Needs two caption feature roles: ``image`` (whole images) and ``object`` (an object feature
    set from ``mmcse extract-objects``, which names its objects table). Both grounded terms apply
    to caption batches only.

    ``views`` (inherited from MCSE) applies to both grounded terms: ``"mean"`` (default) averages
    the two dropout views — MCSE's released ``model.py`` for α, and the same reading for β —
    ``"sum"`` adds them (MCSE's eq. 3 as printed; α and β effectively doubled against eqs. 7–8).
    """

    name: ClassVar[str] = "mcseo"
    caption_roles: ClassVar[tuple[str, ...]] = ("image", "object")
    object_phrase_weight: float = 0.005
    object_temperature: float = 0.05

    def terms(self) -> list[Term]:
        alignment = Term(
            "object_phrase",
            "object_phrase_info_nce",
            self.object_phrase_weight,
            "caption",
            {"temperature": self.object_temperature, "views": self.views},
            {"phrase": Head(HIDDEN, self.proj_dim), "object": Head("object", self.proj_dim)},
        )
        return [*super().terms(), alignment]

    def batch_inputs(self, data: RunData, batch: HostBatch) -> BatchInputs:
        """Phrase token spans and paired object features of a caption batch.

        Spans come from the student tokenizer's offsets (same ``max_length`` as the cached
        ``input_ids``, so tokens line up), computed once per corpus (:class:`PhraseIndex`). The
        ``[B, P, D]`` object features are the batch's ``object`` feature role, where the loss
        reads its teacher roles. Without dynamic padding (static shapes, e.g. a captured step)
        the pairs are padded to the corpus's most pairs per caption, as the tokens to max length.
        """
        if batch.kind != "caption" or self.object_phrase_weight == 0:
            return BatchInputs()
        static = not data.cfg.dynamic_padding
        phrases = self._phrase_index(data).batch(batch.rows, static).to(batch.input_ids.device)
        return BatchInputs(
            extras={"phrase_spans": phrases.spans, "phrase_mask": phrases.mask},
            features={"object": phrases.objects},
        )

    def _phrase_index(self, data: RunData) -> PhraseIndex:
        source = data.sources["caption"]
        cached = self.__dict__.get("_phrases")
        if cached is None or cached[0] is not source:
            object_set = data.feature_sets["object"]
            index = PhraseIndex.build(
                [str(i) for i in source.ids],
                list(source.texts),
                data.tokenizer,
                data.cfg.max_seq_length,
                table_of(object_set.path, object_set.manifest.extra),
                object_set,
            )
            self.__dict__["_phrases"] = cached = (source, index)
        return cached[1]
