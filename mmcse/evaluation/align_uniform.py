"""Alignment and uniformity of an embedding space (Wang & Isola, ICML 2020), on STS-B.

On L2-normalised embeddings ``f``::

    L_align   = E_{(x, x+) ~ p_pos} ||f(x) - f(x+)||_2^2                      (alpha = 2)
    L_uniform = log E_{x, y ~ p_data, i.i.d.} exp(-2 ||f(x) - f(y)||_2^2)     (t = 2)

Lower is better for both. MCSE (Zhang et al., NAACL 2022, Sec. 4.2, eq. 5-6 and footnote 5)
follows SimCSE (Gao et al., 2021): ``p_pos`` = STS-B pairs whose gold score is above 4.0,
``p_data`` = the full STS-B. Neither paper released this code, and MCSE notes its absolute
values may differ from SimCSE's; we read "full STS-B" literally as train + dev + test, take
each distinct sentence once for ``p_data``, and average the uniformity term over all pairs of
distinct rows (``i != j``), which is what ``torch.pdist`` in Wang & Isola's reference code does.
"""

from __future__ import annotations

import numpy as np
import torch

from mmcse.errors import BadValueError

#: gold score above which an STS-B pair counts as a positive (MCSE footnote 5)
POSITIVE_THRESHOLD = 4.0


def l2_normalize_rows(vectors: np.ndarray) -> torch.Tensor:
    x = torch.as_tensor(vectors, dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)


def alignment(left: np.ndarray, right: np.ndarray) -> float:
    """Mean squared distance between normalised positive pairs (row i of left with row i of right)."""
    a, b = l2_normalize_rows(left), l2_normalize_rows(right)
    return float((a - b).pow(2).sum(dim=1).mean())


def uniformity(vectors: np.ndarray, t: float = 2.0, chunk_rows: int = 1024) -> float:
    """``log`` of the mean Gaussian potential over all pairs of distinct rows.

    Chunked so that tens of thousands of sentences fit in memory: for unit vectors
    ``||x - y||^2 = 2 - 2 x.y``; the diagonal (``exp(0) = 1`` per row) is removed from the sum.
    """
    x = l2_normalize_rows(vectors)
    n = x.shape[0]
    if n < 2:
        raise BadValueError("uniformity needs at least two sentences")
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, n, chunk_rows):
        block = x[start : start + chunk_rows]
        squared = (2.0 - 2.0 * block @ x.T).clamp(min=0.0)
        total += torch.exp(-t * squared).sum()
    off_diagonal = total - n
    return float(torch.log(off_diagonal / (n * (n - 1))))


def align_uniform(
    pairs: list[tuple[str, str]], gold: np.ndarray, vectors: np.ndarray, row: dict[str, int]
) -> dict:
    """Both metrics for STS-B ``pairs``/``gold`` given embeddings ``vectors[row[sentence]]``."""
    positives = [
        pair for pair, score in zip(pairs, gold, strict=True) if score > POSITIVE_THRESHOLD
    ]
    if not positives:
        raise BadValueError(f"no STS-B pair has a gold score above {POSITIVE_THRESHOLD}")
    sentences = list(dict.fromkeys(s for pair in pairs for s in pair))
    left = vectors[[row[a] for a, _ in positives]]
    right = vectors[[row[b] for _, b in positives]]
    return {
        "alignment": alignment(left, right),
        "uniformity": uniformity(vectors[[row[s] for s in sentences]]),
        "positive_pairs": len(positives),
        "sentences": len(sentences),
    }
