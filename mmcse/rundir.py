"""The layout of a training run directory: one owner for every name in it.

    RUN/
      config.json            the resolved TrainConfig
      plan.json              what the run will do (printed at start)
      metrics.jsonl          one record per log window and per dev evaluation
      best/                  best checkpoint by STS-B dev: HF model dir + heads + run info
      last/                  resumable checkpoint (adds trainer_state)
      results.json           STS test scores of best/ (written at the end of training)
      transfer.json          SentEval transfer results (mmcse eval --tasks transfer)
      retrieval.json         cross-modal retrieval results (mmcse eval --tasks retrieval)

A checkpoint directory holds an ordinary HF model (``save_pretrained``) plus
``mmcse_heads.safetensors`` (training-only loss heads) and ``mmcse_run.json`` (config, method,
fingerprints of every set it trained on, whether the run finished).
"""

from __future__ import annotations

CONFIG_FILE = "config.json"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
BEST_DIR = "best"
LAST_DIR = "last"
RESULTS_FILE = "results.json"
TRANSFER_FILE = "transfer.json"
RETRIEVAL_FILE = "retrieval.json"
RUN_INFO_FILE = "mmcse_run.json"
HEADS_FILE = "mmcse_heads.safetensors"
TRAINER_STATE_FILE = "trainer_state.pt"  # in last/: optimizer, scheduler, RNG, data position
