"""``mmcse train``: settings from defaults < a config file < flags; a dry run, a run, or a resume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from mmcse.training.config import GivenSettings, resolve_config


def launch(
    config_file: str | Path | None = None,
    settings: GivenSettings | None = None,
    *,
    resume: str | Path | None = None,
    dry_run: bool = False,
) -> Iterator[str]:
    """Resolve the config (``settings``: the flags given, checked when made) and train it, or
    continue the run in ``resume`` (a finished one only when a larger ``--max-steps``/``--epochs``
    extends it: else that it finished is said and nothing done); ``dry_run`` checks every input
    and trains nothing. Yields the result's lines."""
    given = settings or GivenSettings()
    if resume:
        from mmcse.training.checkpoint import finished_note, resume_config

        cfg = resume_config(resume, config_file, given)
        finished = finished_note(cfg.to_dict())
        if finished is not None:  # a finished run, not extended: nothing to do
            yield finished
            return
    else:
        cfg = resolve_config(config_file, given)
    if dry_run:
        from mmcse.training.preflight import preflight

        checked = preflight(cfg, resuming=bool(resume))  # the checks a run makes first
        method, figures = checked.method, checked.preview
        from mmcse.training.plan import describe_preview  # loads torch: after the cheap checks

        yield json.dumps(cfg.to_dict(), indent=2)
        yield method.describe()
        yield describe_preview(figures)
        yield "preflight: every input checked"
        return

    from mmcse.training.preflight import check_inputs

    check_inputs(cfg)  # a missing input in about a second, before the loop's imports
    from mmcse.training.loop import train  # torch + transformers: only once inputs are there

    result = train(cfg, resume=bool(resume))
    if result.test is not None:
        yield result.table()
    yield f"run directory: {result.output_dir}"
