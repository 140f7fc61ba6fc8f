"""DALR's losses against loop re-computations, its SimCSE reduction, and its role bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch

import mmcse.methods  # noqa: F401  (registers every loss and method)
from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs
from mmcse.losses.cross_modal_alignment import CrossModalAlignmentLoss
from mmcse.losses.global_local_info_nce import GlobalLocalInfoNCELoss
from mmcse.losses.heads import AlignerHead, MLPHead
from mmcse.losses.image_text_consistency import ImageTextConsistencyLoss, random_derangement
from mmcse.losses.info_nce import SimCSELoss
from mmcse.losses.intra_modal_alignment import IntraModalAlignmentLoss, mixed_teacher_similarity
from mmcse.losses.list_mle_distillation import ListMLEDistillationLoss, list_mle
from mmcse.methods import build_heads, build_losses, build_method

H, B, D = 16, 6, 10
TEACHERS = (("teacher_a", 0.33), ("teacher_b", 0.67))


def cos(a, b):
    a, b = a.detach().tolist(), b.detach().tolist()
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def softmax(values):
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def teacher_sim_loop(features, i, j):
    return sum(w * cos(features[r][i], features[r][j]) for r, w in TEACHERS)


@pytest.fixture
def inputs():
    torch.manual_seed(0)
    features = {
        "teacher_a": torch.randn(B, 8),
        "teacher_b": torch.randn(B, 12),  # teachers of different widths mix by similarity
        "image": torch.randn(B, D),
    }
    view1 = torch.randn(B, H, requires_grad=True)
    view2 = torch.randn(B, H, requires_grad=True)
    return LossInputs(view1, view2, features=features, batch_kind="caption")


def test_mixed_teacher_similarity_matches_loop(inputs):
    got = mixed_teacher_similarity(inputs, TEACHERS)
    for i in range(B):
        for j in range(B):
            assert got[i, j].item() == pytest.approx(
                teacher_sim_loop(inputs.features, i, j), abs=1e-5
            )


def student_head():
    return {"student": MLPHead(H, H, "bert")}


def test_list_mle_matches_loop(inputs):
    loss = ListMLEDistillationLoss(text_teachers=TEACHERS, temperature=0.1, log_eps=0.0)
    heads = student_head()  # eq. 10 exactly (the released ε: the test below)
    got = loss(inputs, heads)["rank_loss"].item()
    h1, h2 = heads["student"](inputs.view1), heads["student"](inputs.view2)
    total = 0.0
    for i in range(B):
        ranking = sorted(range(B), key=lambda j: -teacher_sim_loop(inputs.features, i, j))
        scores = [cos(h1[i], h2[j]) / 0.1 for j in ranking]
        for r in range(B):
            total -= scores[r] - math.log(sum(math.exp(s) for s in scores[r:]))
    assert got == pytest.approx(total / B, rel=1e-5)


def released_list_mle_row(scores, order, eps):
    """One anchor of the released ListMLE, in torch scalars (autograd follows the max too):
    Σ_r log(Σ_{q ≥ r} exp(S_q − M) + ε) − (S_r − M), the candidates in the teacher's order."""
    ranked = [scores[j] for j in order]
    top = torch.stack(ranked).max()
    total = 0.0
    for r in range(len(ranked)):
        tail = sum(torch.exp(ranked[q] - top) for q in range(r, len(ranked)))
        total = total + torch.log(tail + eps) - (ranked[r] - top)
    return total


@pytest.mark.parametrize("eps", [1e-7, 0.0])
def test_list_mle_log_eps_matches_loop_with_its_gradient(eps):
    """Close views (the diagonal far above the rest): the released ε = 1e-7 changes the loss
    and its gradient; ε = 0 is eq. 10. Loss and gradient against a loop, for both."""
    torch.manual_seed(1)
    n, dim = 8, 6
    h1 = torch.randn(n, dim)
    h2 = h1 + 0.01 * torch.randn(n, dim)
    teacher = torch.randn(n, n)
    scores = (unit_rows(h1) @ unit_rows(h2).T / 0.05).double().requires_grad_(True)
    loss = list_mle(scores, teacher, eps)
    (grad,) = torch.autograd.grad(loss, scores)
    loop_scores = scores.detach().clone().requires_grad_(True)
    expected = 0.0
    for i in range(n):
        order = sorted(range(n), key=lambda j: -float(teacher[i, j]))
        expected = expected + released_list_mle_row(loop_scores[i], order, eps) / n
    (expected_grad,) = torch.autograd.grad(expected, loop_scores)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(grad, expected_grad, rtol=1e-4, atol=1e-6)
    exact = list_mle(scores, teacher, 0.0).item()
    if eps:  # not a rounding detail: this batch's loss moves by more than 5 %
        assert loss.item() > 1.05 * exact
    else:
        assert loss.item() == pytest.approx(exact)


def unit_rows(x):
    return x / x.norm(dim=-1, keepdim=True)


def test_intra_modal_kl_matches_loop(inputs):
    loss = IntraModalAlignmentLoss(TEACHERS, temperature=0.2, teacher_temperature=0.5)
    heads = student_head()
    got = loss(inputs, heads)["ima_loss"].item()
    h1, h2 = heads["student"](inputs.view1), heads["student"](inputs.view2)
    expected = 0.0
    for i in range(B):
        q = softmax([teacher_sim_loop(inputs.features, i, j) / 0.5 for j in range(B)])
        p = softmax([cos(h1[i], h2[j]) / 0.2 for j in range(B)])
        expected += kl(q, p)
    assert got == pytest.approx(expected / B, rel=1e-5)


def test_cross_modal_alignment_matches_loop(inputs):
    loss = CrossModalAlignmentLoss(text_teachers=TEACHERS, temperature=0.2, teacher_temperature=0.5)
    heads = {"student": MLPHead(H, 8), "image": MLPHead(D, 8)}
    got = loss(inputs, heads)["cma_loss"].item()
    text, image = heads["student"](inputs.view1), heads["image"](inputs.features["image"])
    raw_image = inputs.features["image"]
    text_side = image_side = 0.0
    for i in range(B):  # text anchor i: a distribution over images, target the text teachers
        q = softmax([teacher_sim_loop(inputs.features, i, j) / 0.5 for j in range(B)])
        text_side += kl(q, softmax([cos(text[i], image[j]) / 0.2 for j in range(B)]))
    for j in range(B):  # image anchor j: a distribution over captions, target the image teacher
        q = softmax([cos(raw_image[j], raw_image[k]) / 0.5 for k in range(B)])
        image_side += kl(q, softmax([cos(text[i], image[j]) / 0.2 for i in range(B)]))
    assert got == pytest.approx((text_side + image_side) / (2 * B), rel=1e-5)


def test_cross_modal_alignment_raw_image_matches_loop(inputs):
    """No image head (the released code): the student head's output against the raw feature,
    which then has the head's width (CLIP ViT-L/14's 768 = BERT's pooler)."""
    loss = CrossModalAlignmentLoss(text_teachers=TEACHERS, temperature=0.2, teacher_temperature=0.5)
    heads = {"student": MLPHead(H, D)}
    got = loss(inputs, heads)["cma_loss"].item()
    text, image = heads["student"](inputs.view1), inputs.features["image"]
    text_side = image_side = 0.0
    for i in range(B):
        q = softmax([teacher_sim_loop(inputs.features, i, j) / 0.5 for j in range(B)])
        text_side += kl(q, softmax([cos(text[i], image[j]) / 0.2 for j in range(B)]))
    for j in range(B):
        q = softmax([cos(image[j], image[k]) / 0.5 for k in range(B)])
        image_side += kl(q, softmax([cos(text[i], image[j]) / 0.2 for i in range(B)]))
    assert got == pytest.approx((text_side + image_side) / (2 * B), rel=1e-5)


def test_cross_modal_alignment_raw_image_of_another_width_is_refused(inputs):
    loss = CrossModalAlignmentLoss(text_teachers=TEACHERS)
    with pytest.raises(MmcseError) as info:
        loss(inputs, {"student": MLPHead(H, H)})
    message = str(info.value)
    assert f"{H}-d student head" in message and f"'image' feature, which is {D}-d" in message
    assert "cma_image_head" in message and "\n" not in message


def test_consistency_matches_loop(inputs):
    loss = ImageTextConsistencyLoss(margin=0.2)
    heads = {"text_aligner": AlignerHead(H, 8), "image_aligner": AlignerHead(D, 8)}
    torch.manual_seed(7)
    got = loss(inputs, heads)["consistency_loss"].item()
    torch.manual_seed(7)
    shuffled = random_derangement(B).tolist()
    text = heads["text_aligner"](inputs.view1)
    image = heads["image_aligner"](inputs.features["image"])
    other = heads["image_aligner"](inputs.features["image"][shuffled])
    pairs = [1 - cos(text[i], image[i]) for i in range(B)]
    pairs += [max(0.0, cos(text[i], other[i]) - 0.2) for i in range(B)]
    assert got == pytest.approx(sum(pairs) / (2 * B), rel=1e-5)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_derangement_is_a_seeded_permutation_without_fixed_points(n):
    torch.manual_seed(3)
    first = random_derangement(n).tolist()
    torch.manual_seed(3)
    assert random_derangement(n).tolist() == first
    assert sorted(first) == list(range(n))
    assert all(first[i] != i for i in range(n))


def test_global_local_matches_loop():
    torch.manual_seed(0)
    tokens = torch.randn(B, 4, D)
    tokens[1, 2:] = 0  # padding
    tokens[3, 3:] = 0
    inputs = LossInputs(
        torch.randn(B, H), torch.randn(B, H), features={"text_teacher_tokens": tokens}
    )
    loss, head = GlobalLocalInfoNCELoss(temperature=0.1), MLPHead(H, D)
    got = loss(inputs, {"student": head})["global_local_loss"].item()
    g = head(inputs.view1)
    valid = [[t for t in range(4) if tokens[j, t].abs().sum() > 0] for j in range(B)]
    total = 0.0
    for i in range(B):
        negatives = [
            math.exp(cos(g[i], tokens[j, t]) / 0.1) for j in range(B) if j != i for t in valid[j]
        ]
        per_token = []
        for t in valid[i]:
            positive = math.exp(cos(g[i], tokens[i, t]) / 0.1)
            per_token.append(-math.log(positive / (positive + sum(negatives))))
        total += sum(per_token) / len(per_token)
    assert got == pytest.approx(total / B, rel=1e-5)


def test_dalr_without_alignment_terms_is_simcse(inputs):
    method = build_method(
        "dalr",
        cross_modal_weight=0,
        intra_modal_weight=0,
        image_text_weight=0,
        text_objective="infonce",
    )
    (term,) = method.active_terms()
    student, heads = build_losses(method)[term.name], build_heads(method, H, {})
    reference = {"student": MLPHead(H, H)}
    reference["student"].load_state_dict(heads[term.head_names()["student"]].state_dict())
    wired = {slot: heads[name] for slot, name in term.head_names().items()}
    got = sum(term.weight * v for v in student(inputs, wired).values())
    expected = SimCSELoss()(inputs, reference)["simcse_loss"]
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert method.text_roles == () and method.caption_roles == ()


def test_gradients_reach_views_and_heads(inputs):
    losses = [
        (ListMLEDistillationLoss(TEACHERS), student_head()),
        (IntraModalAlignmentLoss(TEACHERS), student_head()),
        (
            CrossModalAlignmentLoss(text_teachers=TEACHERS),
            {"student": MLPHead(H, 8), "image": MLPHead(D, 8)},
        ),
        (
            ImageTextConsistencyLoss(),
            {"text_aligner": AlignerHead(H, 8), "image_aligner": AlignerHead(D, 8)},
        ),
    ]
    sum(sum(loss(inputs, heads).values()) for loss, heads in losses).backward()
    assert inputs.view1.grad.abs().sum() > 0 and inputs.view2.grad.abs().sum() > 0
    for loss, heads in losses:
        for head in heads.values():
            assert all(p.grad is not None for p in head.parameters()), type(loss).__name__


def test_roles_follow_the_switches():
    default = build_method("dalr", teachers_on="all")
    teachers = ("text_teacher_simcse", "text_teacher_diffcse")  # the scripts' order
    assert default.text_roles == teachers
    assert set(default.caption_roles) == {"image", *teachers}
    caption_only = build_method("dalr", teachers_on="caption", global_local_weight=1.0)
    assert caption_only.text_roles == ()
    assert "text_teacher_tokens" in caption_only.caption_roles
    swapped = build_method("dalr", teachers_on="all", text_teachers=[["text_teacher_rankcse", 1.0]])
    assert swapped.text_roles == ("text_teacher_rankcse",)


def test_bad_switch_is_refused():
    with pytest.raises(ValueError, match="text_objective"):
        build_method("dalr", text_objective="arcface")
