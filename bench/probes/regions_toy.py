"""Probe, 2026-11-26 (BENCHMARKS.md, "Compile: what else was tried"): can a gradient taken
inside the compiled graph go through layers marked as nested compile regions? A toy of the
captured update: 6 residual MLP layers, a loss, its gradient (``torch.autograd.grad`` traced
with ``torch._dynamo.config.trace_autograd_ops``), an SGD step, ``fullgraph=True``.

Run: ``python bench/probes/regions_toy.py MODE`` with MODE one of
``plain`` (no regions), ``regions`` (each layer a ``torch.compiler.nested_compile_region``),
``regions-flat`` (regions, the parameters views of one flat buffer, as in
:class:`mmcse.update.FlatParameters`), ``regions-backward`` (regions, only the forward compiled
and ``backward()`` outside, the capture DDP and fp16 runs use: compares gradients). Prints
the compile's outcome and, when it compiles, the largest difference to the same steps run
eagerly."""

import sys

import torch
from torch import nn

MODE = sys.argv[1] if len(sys.argv) > 1 else "plain"
torch._dynamo.config.trace_autograd_ops = True


def marked(fn):
    return torch.compiler.nested_compile_region(fn) if MODE.startswith("regions") else fn


class Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.LayerNorm(d)

    @marked
    def forward(self, x):
        return self.norm(x + self.b(torch.nn.functional.gelu(self.a(x))))


class Toy(nn.Module):
    def __init__(self, d: int = 32, layers: int = 6) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(d) for _ in range(layers))

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x.square().mean()


def sgd_steps(model: Toy, x, steps: int, compiled: bool) -> None:
    params = list(model.parameters())

    def step(x):
        grads = torch.autograd.grad(model(x), params)
        with torch.no_grad():
            torch._foreach_sub_(params, [0.1 * g for g in grads])

    run = torch.compile(step, backend="aot_eager", fullgraph=True) if compiled else step
    for _ in range(steps):
        run(x)


def main() -> None:
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(8, 32)
    reference = Toy()
    reference.load_state_dict(model.state_dict())
    if MODE == "regions-flat":
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        start = 0
        for p in model.parameters():
            p.data = flat[start : start + p.numel()].view_as(p)
            start += p.numel()
    if MODE == "regions-backward":
        torch.compile(model, backend="aot_eager", fullgraph=True)(x).backward()
        reference(x).backward()
        pairs = zip(model.parameters(), reference.parameters(), strict=True)
        diff = max((a.grad - b.grad).abs().max().item() for a, b in pairs)
        print(f"{MODE}: compiled; largest gradient difference to eager {diff:.2e}")
        return
    try:
        sgd_steps(model, x, 2, compiled=True)
    except Exception as exc:  # the finding is whether Dynamo accepts it
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        why = next((line for line in lines if line.startswith("Explanation:")), lines[0])
        cause = why.split("got RuntimeError(")[-1] if "got RuntimeError(" in why else why
        print(f"{MODE}: the compile failed: {type(exc).__name__}: {cause[:200]}")
        return
    sgd_steps(reference, x, 2, compiled=False)
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    print(f"{MODE}: compiled; largest difference to eager after 2 steps {diff:.2e}")


if __name__ == "__main__":
    main()
