"""Issue 8's loss/method fidelity points, each term recomputed from its equation with plain torch.

Both readings of every switch are checked: MCSE/MCSEO views (mean = released ``model.py``,
sum = eq. 3), KDMCSE's false-negative filter (off = released scripts, on = paper), DALR's two
compositions (``dalr`` = released code, ``dalr-paper`` = eq. 14), and the BERT head init. The
reference maths below never calls the loss being tested; it only reads the trained parameters
(heads) out of the modules.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import mmcse.methods  # noqa: F401  (registers every loss and method)
from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.losses.image_text_info_nce import ImageTextInfoNCELoss
from mmcse.losses.object_phrase import ObjectPhraseInfoNCELoss
from mmcse.methods import build_heads, build_losses, build_method
from mmcse.training.student import Student

B, H = 6, 16


# ---- reference maths (plain torch ops, written from the equations) -------------------------


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def cos_matrix(a, b):
    return unit(a.double()) @ unit(b.double()).T


def nll_diagonal(logits):
    """Mean over rows of −log softmax(row)[i] (InfoNCE with positives on the diagonal)."""
    logits = logits.double()
    log_z = torch.log(torch.exp(logits).sum(dim=1))
    return (log_z - logits.diagonal()).mean()


def arc(cos, margin, scale=None):
    """cos(θ_ij − Δ_ij) off the diagonal where θ_ij > m (Δ = m, or (1 − s_ij)·m), else cos."""
    out = cos.clone()
    for i in range(cos.shape[0]):
        for j in range(cos.shape[1]):
            theta = math.acos(max(-1.0, min(1.0, float(cos[i, j].detach()))))
            if i != j and theta > margin:
                delta = margin if scale is None else (1 - float(scale[i, j])) * margin
                out[i, j] = math.cos(theta - delta)
    return out


def kl_rows(teacher_logits, student_logits):
    """Mean over rows of KL(softmax(teacher) ‖ softmax(student))."""
    q = torch.softmax(teacher_logits.double(), dim=1)
    log_p = torch.log_softmax(student_logits.double(), dim=1)
    return (q * (torch.log(q) - log_p)).sum(dim=1).mean()


def list_mle_loop(scores, teacher, eps=0.0):
    """−(1/N) Σ_i Σ_r log exp(S_i[π(r)]) / Σ_{q ≥ r} exp(S_i[π(q)]), π sorting the teacher
    (eq. 10); with ``eps`` the released ``ListMLE``: Σ_r log(Σ_{q ≥ r} exp(S_q − M) + ε) −
    (S_r − M), M the row's maximum."""
    total = 0.0
    for i in range(scores.shape[0]):
        order = sorted(range(scores.shape[1]), key=lambda j: -float(teacher[i, j]))
        ranked = [float(scores[i, j].detach()) for j in order]
        top = max(ranked)
        for r in range(len(ranked)):
            tail = sum(math.exp(v - top) for v in ranked[r:])
            total += math.log(tail + eps) - (ranked[r] - top)
    return total / scores.shape[0]


def cosine_embedding(text, image, shuffled, margin):
    """Mean over the 2B pairs of 1 − cos (matched) and max(0, cos − m) (mismatched)."""
    matched = 1 - (unit(text.double()) * unit(image.double())).sum(-1)
    mismatched = ((unit(text.double()) * unit(shuffled.double())).sum(-1) - margin).clamp_min(0)
    return torch.cat([matched, mismatched]).mean()


def head(module, x):
    """A Linear + Tanh head applied by hand (its parameters read from the module)."""
    linear = module[0]
    return torch.tanh(x.double() @ linear.weight.double().T + linear.bias.double())


# ---- 1. MCSE image–text term and MCSEO object–phrase term: views ---------------------------


@pytest.fixture
def caption_inputs():
    torch.manual_seed(0)
    image = torch.randn(B, 12)
    return LossInputs(torch.randn(B, H), torch.randn(B, H), {"image": image}, "caption")


def mcse_view_losses(heads, inputs):
    v = head(heads["image"], inputs.features["image"])
    return [
        nll_diagonal(cos_matrix(head(heads["student"], x), v) / 0.05)
        for x in (inputs.view1, inputs.view2)
    ]


@pytest.mark.parametrize(
    ("views", "combine"),
    [
        ("mean", lambda a, b: (a + b) / 2),  # MCSE's released src/model.py
        ("sum", lambda a, b: a + b),  # eq. 3 as printed
        ("first", lambda a, b: a),  # DALR's eq. 4: one view
    ],
)
def test_mcse_image_text_views(caption_inputs, views, combine):
    loss = ImageTextInfoNCELoss(views=views)
    heads = {"student": MLPHead(H, 8), "image": MLPHead(12, 8)}
    got = loss(caption_inputs, heads)["image_text_loss"].item()
    assert got == pytest.approx(combine(*mcse_view_losses(heads, caption_inputs)).item(), rel=1e-5)


def test_mcse_method_defaults_to_the_released_mean_and_keeps_the_sum():
    (_, term) = build_method("mcse").terms()
    assert term.options["views"] == "mean" and term.weight == 0.01
    (_, term) = build_method("mcse", views="sum").terms()
    assert term.options["views"] == "sum"
    mcseo = build_method("mcseo")
    assert {t.name: t.options.get("views") for t in mcseo.terms()} == {
        "simcse": None,
        "image_text": "mean",
        "object_phrase": "mean",
    }
    assert build_method("mcseo", views="sum").terms()[2].options["views"] == "sum"


def object_phrase_eq7(heads, states, spans, mask, objects, tau=0.05):
    """Eq. 7 per pair (pairs with ≥ 2 phrases), summed over phrases, averaged over the B pairs."""
    o = head(heads["object"], objects)
    total = 0.0
    for b in range(states.shape[0]):
        real = [k for k in range(mask.shape[1]) if mask[b, k]]
        if len(real) < 2:
            continue
        for k in real:
            start, end = spans[b, k].tolist()
            phrase = head(heads["phrase"], states[b, start:end].mean(0, keepdim=True))[0]
            logits = [float((unit(phrase) @ unit(o[b, j])).detach()) / tau for j in real]
            total -= logits[real.index(k)] - math.log(sum(math.exp(v) for v in logits))
    return total / states.shape[0]


@pytest.mark.parametrize("views", ["mean", "sum", "first"])
def test_object_phrase_views(views):
    torch.manual_seed(3)
    loss = ObjectPhraseInfoNCELoss(views=views)
    heads = {"phrase": MLPHead(6, 4), "object": MLPHead(10, 4)}
    states = (torch.randn(3, 6, 6), torch.randn(3, 6, 6))
    spans = torch.tensor(
        [[[1, 2], [2, 4], [4, 6]], [[1, 3], [3, 4], [-1, -1]], [[1, 2], [-1, -1], [-1, -1]]]
    )
    mask = spans[..., 0] >= 0
    objects = torch.randn(3, 3, 10)
    inputs = LossInputs(
        torch.randn(3, 6),
        torch.randn(3, 6),
        features={"object": objects},
        batch_kind="caption",
        token_states=states,
        extras={"phrase_spans": spans, "phrase_mask": mask},
    )
    per_view = [object_phrase_eq7(heads, s, spans, mask, objects) for s in states]
    expected = {"mean": sum(per_view) / 2, "sum": sum(per_view), "first": per_view[0]}[views]
    assert loss(inputs, heads)["object_phrase_loss"].item() == pytest.approx(expected, rel=1e-5)


def test_unknown_views_value_is_refused():
    with pytest.raises(ValueError, match="views must be one of"):
        ImageTextInfoNCELoss(views="max")


# ---- 3. KDMCSE false-negative filter ---------------------------------------------------------


def adapacse_reference(loss, heads, inputs, threshold):
    """Eq. of AdapACSE (image target) with the false-negative filter on the normalised
    text–image teacher cosine, mean over the two views."""
    raw_image, raw_text = inputs.features["clip_image"], inputs.features["clip_text"]
    keys = head(heads["image"], raw_image)
    similarity = cos_matrix(raw_image, raw_image)
    drop = torch.zeros(B, B, dtype=torch.bool)
    if threshold is not None:
        drop = (cos_matrix(raw_text, raw_image) > threshold) & ~torch.eye(B, dtype=torch.bool)
    losses = []
    for view in (inputs.view1, inputs.view2):
        cos = cos_matrix(head(heads["student"], view), keys)
        logits = arc(cos, loss.margin, similarity) / 0.05
        losses.append(nll_diagonal(logits.masked_fill(drop, float("-inf"))))
    return sum(losses) / 2, int(drop.sum())


@pytest.mark.parametrize("filter_on", [False, True])
def test_kdmcse_false_negative_filter(filter_on):
    torch.manual_seed(4)
    image = torch.randn(B, 8)
    text = image + 0.1 * torch.randn(B, 8)
    text[1] = image[0]  # caption 1 describes image 0 too: a false negative for anchor 1
    inputs = LossInputs(
        torch.randn(B, H), torch.randn(B, H), {"clip_image": image, "clip_text": text}, "caption"
    )
    method = build_method("kdmcse", false_negative_filter=filter_on, false_negative_threshold=0.9)
    (_, term) = method.terms()
    assert term.options["false_negative_threshold"] == (0.9 if filter_on else None)
    loss = build_losses(method)[term.name]
    built = build_heads(method, H, {"clip_image": 8, "clip_text": 8})
    heads = {slot: built[name] for slot, name in term.head_names().items()}
    expected, dropped = adapacse_reference(loss, heads, inputs, 0.9 if filter_on else None)
    assert (dropped > 0) == filter_on  # the reference drops caption 1 ↔ image 0 when on
    got = loss(inputs, heads)["image_margin_loss"].item()
    assert got == pytest.approx(expected.item(), rel=1e-5)


def test_kdmcse_filter_is_off_by_default():
    method = build_method("kdmcse")
    assert method.false_negative_filter is False
    assert method.terms()[1].options["false_negative_threshold"] is None


# ---- 2. DALR: the released composition and eq. 14 -------------------------------------------

TEACHERS = ("text_teacher_simcse", "text_teacher_diffcse")


class FixedEncoder(nn.Module):
    """Stands in for the student encoder: returns given [CLS] views (two dropout passes)."""

    hidden_size = H

    def __init__(self, view1, view2):
        super().__init__()
        self.register_buffer("views", torch.cat([view1, view2]))

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(sentence=self.views, token_states=None)


def dalr_world(seed=5, image_width=12):
    torch.manual_seed(seed)
    double = {"dtype": torch.float64}
    features = {
        "image": torch.randn(B, image_width, **double),
        "text_teacher_simcse": torch.randn(B, 10, **double),
        "text_teacher_diffcse": torch.randn(B, 10, **double),
    }
    return torch.randn(B, H, **double), torch.randn(B, H, **double), features


def student_total(name, kind, image_width=12, **overrides):
    view1, view2, features = dalr_world(image_width=image_width)
    method = build_method(name, **overrides)
    dims = {role: f.shape[-1] for role, f in features.items()}
    student = Student(FixedEncoder(view1, view2), method, dims).double()
    student.train()
    batch = SimpleNamespace(
        size=B,
        kind=kind,
        input_ids=torch.zeros(B, 4, dtype=torch.long),
        attention_mask=torch.ones(B, 4, dtype=torch.long),
        features=features if kind == "caption" else {r: features[r] for r in method.text_roles},
        packed=None,
    )
    torch.manual_seed(0)
    out = student(batch, {})
    heads = {  # term → slot → the head module it trained
        term: {slot: student.heads[name] for slot, name in slots.items()}
        for term, slots in student.term_heads.items()
    }
    return out, heads, (view1.double(), view2.double(), features)


def teacher_cos(features, mix):
    """Σ_k w_k cos(t^k) ("similarities") or cos(Σ_k w_k t^k) ("embeddings"); SimCSE 0.33."""
    simcse, diffcse = (features[r].double() for r in TEACHERS)
    if mix == "similarities":
        return 0.33 * cos_matrix(simcse, simcse) + 0.67 * cos_matrix(diffcse, diffcse)
    mixed = 0.33 * simcse + 0.67 * diffcse
    return cos_matrix(mixed, mixed)


def test_dalr_released_composition_caption_batch():
    """train_mix.py: loss + 0.1·(0.01·ℓ_cons + ℓ_CMA + AdapACSE) + 0.2·(ℓ_IMA + ℓ_rank), one
    shared pooler z, arc margin 0.18 on the SimCSE/rank/IMA/CMA scores, MARGIN2 0.18; ℓ_CMA
    against the raw image (as wide as the pooler: ViT-L/14's 768 = BERT's), ListMLE's ε 1e-7."""
    out, heads, (v1, v2, f) = student_total("dalr", "caption", image_width=H)
    pooler = heads["simcse"]["student"]
    for name in ("rank", "ima", "cma", "consistency"):
        assert heads[name]["student"] is pooler, name  # one shared head, as the code's z
    assert set(heads["cma"]) == {"student"}  # no image head: model_modified.py line 745
    z1, z2 = head(pooler, v1), head(pooler, v2)
    m, image = 0.18, f["image"].double()
    arc_scores = arc(cos_matrix(z1, z2), m)
    simcse = nll_diagonal(arc_scores / 0.05)
    # ℓ_cons: aligners on z1, images rolled by 5 for the mismatches, margin 0.2
    cons_heads = heads["consistency"]
    text_al = cons_heads["text_aligner"](z1)
    image_al = cons_heads["image_aligner"]
    cons = cosine_embedding(text_al, image_al(image), image_al(image.roll(5, 0)), 0.2)
    # ℓ_CMA: arc scores z1 × raw image /0.05/0.45; text rows ↔ text teacher, image rows ↔ image
    scores = arc(cos_matrix(z1, image), m) / 0.0225
    text_teacher = teacher_cos(f, "embeddings") / 0.5
    image_teacher = cos_matrix(image, image) / 0.5
    cma = (kl_rows(text_teacher, scores) + kl_rows(image_teacher, scores.T)) / 2
    # AdapACSE image half: own grounding heads, margin (1 − s_vv)·0.18, mean over views
    adap_heads = heads["image_text"]
    keys = head(adap_heads["image"], image)
    adap = (
        sum(
            nll_diagonal(
                arc(cos_matrix(head(adap_heads["student"], v), keys), m, cos_matrix(image, image))
                / 0.05
            )
            for v in (v1, v2)
        )
        / 2
    )
    rank = list_mle_loop(arc_scores / 0.05, teacher_cos(f, "similarities"), eps=1e-7)
    ima = kl_rows(text_teacher, arc_scores / 0.0225)
    expected = simcse + 0.1 * (0.01 * cons + cma + adap) + 0.2 * (ima + rank)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    for key, value in {"arc_margin_loss": simcse, "consistency_loss": cons, "cma_loss": cma,
                       "image_margin_loss": adap, "rank_loss": rank, "ima_loss": ima}.items():  # fmt: skip
        assert out[key].item() == pytest.approx(float(torch.as_tensor(value).detach()), rel=1e-6), (
            key
        )


def test_dalr_cma_image_head_switch():
    """``cma_image_head=True``: ℓ_CMA projects the image through an own Linear + Tanh head into
    the pooler's width (any image width fits, e.g. App. B's 512-d CLIP ViT-B/32); False (the
    released code) compares z1 with the raw feature."""
    out, heads, (v1, _, f) = student_total("dalr", "caption", cma_image_head=True)
    pooler, image_head = heads["cma"]["student"], heads["cma"]["image"]
    assert pooler is heads["simcse"]["student"] and image_head is not heads["image_text"]["image"]
    z1, image = head(pooler, v1), f["image"].double()
    scores = arc(cos_matrix(z1, head(image_head, image)), 0.18) / 0.0225
    text_teacher = teacher_cos(f, "embeddings") / 0.5
    image_teacher = cos_matrix(image, image) / 0.5
    cma = (kl_rows(text_teacher, scores) + kl_rows(image_teacher, scores.T)) / 2
    assert out["cma_loss"].item() == pytest.approx(cma.item(), rel=1e-6)


def test_dalr_rank_log_eps_switch():
    """``rank_log_eps``: the released ListMLE's log(Σ exp(S − M) + 1e-7) (default), or eq. 10
    exactly (0, ``dalr-paper``'s); both readings recomputed, and told apart in this batch."""
    got = {}
    for eps in (1e-7, 0.0):
        overrides = {} if eps else {"rank_log_eps": 0.0}
        out, heads, (v1, v2, f) = student_total("dalr", "caption", image_width=H, **overrides)
        pooler = heads["rank"]["student"]
        scores = arc(cos_matrix(head(pooler, v1), head(pooler, v2)), 0.18) / 0.05
        expected = list_mle_loop(scores, teacher_cos(f, "similarities"), eps=eps)
        got[eps] = out["rank_loss"].item()
        assert got[eps] == pytest.approx(expected, rel=1e-6), eps
    assert abs(got[1e-7] - got[0.0]) > 1e-5 * got[0.0]  # the switch changes this batch's loss
    assert build_method("dalr-paper").terms()[4].options["log_eps"] == 0.0


def test_dalr_released_composition_text_batch_is_arc_simcse():
    out, heads, (v1, v2, _) = student_total("dalr", "text", image_width=H)
    z1, z2 = head(heads["simcse"]["student"], v1), head(heads["simcse"]["student"], v2)
    expected = nll_diagonal(arc(cos_matrix(z1, z2), 0.18) / 0.05)
    assert set(out) == {"loss", "arc_margin_loss"}
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_dalr_released_teacher_order_and_numbers():
    method = build_method("dalr")
    assert method.text_teachers == (("text_teacher_simcse", 0.33), ("text_teacher_diffcse", 0.67))
    assert (method.text_margin, method.image_margin, method.student_margin) == (0.18, 0.18, 0.18)
    assert (method.cross_modal_weight, method.intra_modal_weight) == (0.1, 0.2)
    assert method.consistency_weight == 0.01 and method.teachers_on == "caption"


def test_dalr_paper_composition_caption_batch():
    """Eq. 14: ℓ_Info + 0.1·(ℓ_cons + ℓ_CMA) + 0.2·(ℓ_rank + ℓ_IMA); one s^z (H→256) and one
    h^v for eqs. 4, 6, 10, 11; CMA paired as eqs. 6/8 print it; τ = 1 in the KL terms."""
    out, heads, (v1, v2, f) = student_total("dalr-paper", "caption", consistency_mismatch="roll5")
    s_head, hv_head = heads["image_text"]["student"], heads["image_text"]["image"]
    assert s_head[0].out_features == 256
    assert heads["cma"]["student"] is s_head and heads["cma"]["image"] is hv_head
    assert heads["rank"]["student"] is s_head and heads["ima"]["student"] is s_head
    s1, s2 = head(s_head, v1), head(s_head, v2)
    image = f["image"].double()
    h_v = head(hv_head, image)
    info = nll_diagonal(cos_matrix(s1, h_v) / 0.05)  # eq. 4: view z only
    cons_heads = heads["consistency"]
    cons = cosine_embedding(
        cons_heads["text_aligner"](s1),
        cons_heads["image_aligner"](image),
        cons_heads["image_aligner"](image.roll(5, 0)),
        0.2,
    )
    # eq. 6: P_i^{t2v} = softmax_j sim(s_j, h_i^v) — image-anchored — matched to Q^{t2t} (eq. 8)
    text_image = cos_matrix(s1, h_v)  # [text, image]
    q_tt = teacher_cos(f, "embeddings")
    q_vv = cos_matrix(image, image)
    cma = (kl_rows(q_tt, text_image.T) + kl_rows(q_vv, text_image)) / 2
    rank = list_mle_loop(cos_matrix(s1, s2) / 0.05, q_tt)
    ima = kl_rows(q_tt, cos_matrix(s1, s2))
    expected = info + 0.1 * (cons + cma) + 0.2 * (rank + ima)
    assert "simcse_loss" not in out and "arc_margin_loss" not in out
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_dalr_paper_text_batch_is_the_intra_modal_terms():
    out, heads, (v1, v2, f) = student_total("dalr-paper", "text")
    s_head = heads["rank"]["student"]
    s1, s2 = head(s_head, v1), head(s_head, v2)
    q_tt = teacher_cos(f, "embeddings")
    expected = 0.2 * (
        list_mle_loop(cos_matrix(s1, s2) / 0.05, q_tt) + kl_rows(q_tt, cos_matrix(s1, s2))
    )
    assert set(out) == {"loss", "rank_loss", "ima_loss"}
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_dalr_variants_differ_only_by_named_fields():
    released, paper = build_method("dalr"), build_method("dalr-paper")
    differing = {k for k, v in released.to_dict().items() if paper.to_dict()[k] != v}
    assert differing == {
        "name",
        "simcse_weight",
        "image_text_in_cross_modal",
        "consistency_weight",
        "consistency_mismatch",
        "text_objective",
        "image_objective",
        "image_views",
        "student_margin",
        "kl_temperature",
        "teacher_temperature",
        "teachers_on",
        "rank_teacher_mix",
        "rank_log_eps",
        "cma_pairing",
        "student_head_dim",
        "cma_image_head",
        "share_image_head",
    }
    # moving every switch of the released method to the paper's values gives eq. 14
    moved = build_method("dalr", **{k: paper.to_dict()[k] for k in differing - {"name"}})
    assert [(t.name, t.loss, t.weight, t.on, t.options, t.heads) for t in moved.terms()] == [
        (t.name, t.loss, t.weight, t.on, t.options, t.heads) for t in paper.terms()
    ]


def test_dalr_bad_switch_value_is_refused():
    with pytest.raises(ValueError, match="cma_pairing"):
        build_method("dalr-paper", cma_pairing="transposed")


# ---- 4. VisualCSE / AudioCSE: the released --new_supcon objective ---------------------------


@pytest.mark.parametrize(("name", "field"), [("visualcse", "image"), ("audiocse", "audio")])
def test_nonlinguistic_objective_switch(name, field):
    """Default: the released ``--new_supcon`` cross-entropy (target = the class rank among the
    batch's classes); ``supcon`` (the paper's name) and ``simclr`` are the switches."""
    from mmcse.registry import LOSSES

    assert build_method(name).nonlinguistic_settings().objective == "class_rank_cross_entropy"
    torch.manual_seed(6)
    f1, f2 = torch.randn(B, 5), torch.randn(B, 5)
    labels = torch.tensor([4, 1, 4, 0, 1, 9])
    ranks = [sorted(set(labels.tolist())).index(y) for y in labels.tolist()]  # [2, 1, 2, 0, 1, 3]
    cos = cos_matrix(f1, f2) / 0.07
    log_z = torch.log(torch.exp(cos).sum(dim=1))
    new_supcon = (log_z - cos[torch.arange(B), torch.tensor(ranks)]).mean()
    readings = {"class_rank_cross_entropy": new_supcon, "simclr": nll_diagonal(cos)}
    for objective, expected in readings.items():
        method = build_method(name, **{f"{field}_objective": objective})
        settings = method.nonlinguistic_settings()
        loss = LOSSES.get(settings.objective)(temperature=settings.temperature)
        args = (f1, f2, labels) if objective != "simclr" else (f1, f2)
        got = loss.compute_loss_from_embeddings(*args, temperature=settings.temperature)
        assert got.item() == pytest.approx(expected.item(), rel=1e-5), objective
    assert build_method(name, **{f"{field}_objective": "supcon"}).nonlinguistic_settings()
    with pytest.raises(ValueError, match="objective"):
        build_method(name, **{f"{field}_objective": "new_supcon"})


# ---- 5. heads initialised like BERT ----------------------------------------------------------


def cls_head(method_name, term_name, **overrides):
    """The head a method's term applies to [CLS], as the trainer builds it (H = 256)."""
    method = build_method(method_name, **overrides)
    dims = {"image": 256, "clip_image": 8, "clip_text": 8}  # DALR's raw ℓ_CMA image: H wide
    (term,) = [t for t in method.active_terms() if t.name == term_name]
    return build_heads(method, 256, dims)[term.head_names()["student"]][0]


@pytest.mark.parametrize(
    ("method", "term"),
    [("simcse", "simcse"), ("mcse", "simcse"), ("kdmcse", "text"), ("dalr", "simcse")],
)
def test_cls_heads_are_bert_initialised(method, term):
    torch.manual_seed(0)
    linear = cls_head(method, term)
    assert torch.count_nonzero(linear.bias) == 0
    assert linear.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert linear.weight.mean().abs().item() < 0.002
    torch_init = cls_head(method, term, head_init="torch")
    bound = 1 / math.sqrt(256)  # PyTorch's default: uniform(±1/√fan_in) for weight and bias
    assert torch_init.weight.abs().max().item() <= bound
    assert torch_init.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert torch.count_nonzero(torch_init.bias) > 0


def test_grounding_heads_keep_the_torch_init():
    """MCSE's grounding and image heads live outside BertForCL: PyTorch's default init."""
    torch.manual_seed(0)
    heads = build_heads(build_method("mcse"), 256, {"image": 256})
    for name in ("image_text_student", "image_text_image"):
        linear = heads[name][0]
        assert torch.count_nonzero(linear.bias) > 0, name
        assert linear.weight.abs().max().item() <= 1 / math.sqrt(256), name


def test_simcse_method_passes_head_init():
    assert build_method("simcse").terms()[0].heads["student"].init == "bert"
    assert build_method("mcse", head_init="torch").terms()[0].heads["student"].init == "torch"
    assert build_method("kdmcse").terms()[0].heads["student"].init == "bert"
