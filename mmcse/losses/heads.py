"""Projection heads that several terms of one method share.

Most losses own their heads. Some published methods instead feed *one* student projection to
several terms: DALR's released code uses its SimCSE pooler output ``z1, z2`` for ℓ_SimCSE,
ℓ_rank, ℓ_IMA, ℓ_CMA, ℓ_cons and ℓ_g2l; DALR's paper writes one student score ``s^z`` for
eqs. 4, 6, 10 and 11. A loss given ``student_head="NAME"`` (or ``image_head="NAME"``) takes the
head called NAME from the ``shared_heads`` dict the trainer passes to every loss of a method, and
creates it on first use; every term naming it trains the same parameters. A loss built on its
own (``shared_heads=None``, e.g. in a unit test) has nothing to share with and gets a private
head.
"""

from __future__ import annotations

from torch import nn

HEAD_INITS = ("bert", "torch")


class MLPHead(nn.Sequential):
    """One Linear + Tanh, the projection head SimCSE and MCSE put on [CLS].

    ``init="bert"``: weights normal(0, 0.02), bias zero — BERT's ``_init_weights``, which the
    released code applies to every head built inside its ``BertForCL``/``RobertaForCL``
    (SimCSE's and MCSE's ``cl_init`` → ``init_weights()``: the [CLS] ``mlp``/``pooler``,
    VisualCSE's ``image_mlp``). ``init="torch"``: PyTorch's default Linear init (Kaiming-uniform),
    what the released code's heads *outside* the BERT module get (MCSE's ``grounding`` and
    image ``MLPLayer``, KDMCSE/DALR's grounding heads).
    """

    def __init__(self, in_dim: int, out_dim: int, init: str = "torch") -> None:
        super().__init__(nn.Linear(in_dim, out_dim), nn.Tanh())
        if init not in HEAD_INITS:
            raise ValueError(f"head init must be one of {HEAD_INITS}, not {init!r}")
        if init == "bert":
            nn.init.normal_(self[0].weight, mean=0.0, std=0.02)
            nn.init.zeros_(self[0].bias)


def resolve_head(
    shared: dict | None,
    name: str | None,
    in_dim: int,
    out_dim: int | None,
    init: str = "torch",
) -> MLPHead:
    """The loss's own ``MLPHead`` (``name=None``) or the shared one called ``name``.

    ``out_dim=None`` means "whatever the shared head has" (``in_dim`` when it is created here).
    A shared head asked for with other dimensions is refused (two terms disagreeing on it).
    """
    if name is None or shared is None:
        return MLPHead(in_dim, in_dim if out_dim is None else out_dim, init)
    head = shared.get(name)
    if head is None:
        head = shared[name] = MLPHead(in_dim, in_dim if out_dim is None else out_dim, init)
    linear = head[0]
    if linear.in_features != in_dim or out_dim not in (None, linear.out_features):
        raise ValueError(
            f"shared head {name!r} is {linear.in_features}→{linear.out_features}; a term asked "
            f"for {in_dim}→{out_dim}"
        )
    return head
