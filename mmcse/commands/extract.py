"""Stage 1: ``mmcse extract-images|extract-text|extract-objects|extract-image-tensors|
extract-audio`` and ``import-hdf5``. Each command is a job of :mod:`pipeline.jobs`: its flags are
the job's fields (:mod:`mmcse.commands.flags`), its help the job's docstring, and it runs the job."""

from __future__ import annotations

import typer

from mmcse.commands import show
from mmcse.commands.flags import with_flags
from pipeline import jobs

app = typer.Typer()
COMMANDS = {
    "extract-images": jobs.ImagesJob,
    "extract-text": jobs.TextJob,
    "import-hdf5": jobs.Hdf5Job,
    "extract-objects": jobs.ObjectsJob,
    "extract-image-tensors": jobs.ImageTensorsJob,
    "extract-audio": jobs.AudioJob,
}


def run_job(job) -> None:
    show(str(job.run()))


for name, job in COMMANDS.items():
    app.command(name, help=job.__doc__)(with_flags(job, into="job", build=True)(run_job))
