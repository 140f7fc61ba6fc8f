"""A second run of a method reuses the first run's compiled step (issue 21, item 3).

A recipe's seeds and an ablation's rows compile the same captured update; inductor keeps compiled
graphs on disk (its FX-graph cache, and AOTAutograd's above it), so only the first run should pay
the code generation. That holds only while nothing run-specific (a path, a seed, an object's id)
enters the graph or its cache key, nor a recipe's hyperparameters (issue 33: recipes of one
method on another corpus or with another lr share the compiled step): the peak lr, the warm-up
and the run's length and the term weights are inputs of the step, not traced constants. This
test runs the captured SimCSE step in two fresh processes — different run folders, seeds, lr,
warm-up, total steps and loss weight — sharing one cache folder, and reads inductor's own cache
counters. Inductor on CPU, tiny student: about a minute, the price of
checking the real backend (the other capture tests use ``aot_eager``, which caches nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")),
        reason="inductor's CPU backend needs a C++ compiler",
    ),
]

RUN_ONE_STEP = """
import json, sys, time
from pathlib import Path
from torch._dynamo.utils import counters
from mmcse.bench.train_step import BenchState
from mmcse.demo.synthetic import method_needs, synthetic_world

root, seed, run = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
world = synthetic_world(root, "tiny", 12, 16, method_needs("simcse"))  # 4 batches of 4
state = BenchState.of(world, "simcse", 4, 12, "cpu", "auto", capture="on",
                      dynamic_padding=False, seed=seed, **run)
assert state.trainer.total == run["max_steps"]
started = time.perf_counter()
state.step()
print(json.dumps({"first_step_s": time.perf_counter() - started,
                  "inductor": dict(counters["inductor"]),
                  "aot_autograd": dict(counters["aot_autograd"])}))
"""


#: two recipes of one method: every hyperparameter the step reads differs (a run's length, as
#: ``max_steps`` below the world's 4 batches, is its total steps)
FIRST = {"learning_rate": 3e-5, "max_steps": 3, "warmup_steps": 0,
         "method_args": {"simcse_weight": 1.0}}  # fmt: skip
SECOND = {"learning_rate": 1e-5, "max_steps": 2, "warmup_steps": 1,
          "method_args": {"simcse_weight": 0.5}}  # fmt: skip


def run_captured_step(root: Path, seed: int, run: dict, cache: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    project = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(project), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", RUN_ONE_STEP, str(root), str(seed), json.dumps(run)],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_run_compiles_its_captured_step_from_the_cache(tmp_path):
    cache = tmp_path / "inductor-cache"
    first = run_captured_step(tmp_path / "run-a", 1, FIRST, cache)
    second = run_captured_step(tmp_path / "run-b", 2, SECOND, cache)
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1  # the first run compiles
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1, second
