"""The job wing: what runs inside a job, from one pack down to the processes of its trainings.

In its own order: the job itself (:mod:`.body`: one pack's attempt; :mod:`.turns`: a lane of whole packs;
:mod:`.stream` and :mod:`.lanes`: a streaming lane; :mod:`.records`; :mod:`.oom`) over :mod:`.spread` (one training
over k devices) over :mod:`.pack` (N trainings on one device) over :mod:`.runtime` (the processes) over
:mod:`.workloads` (the built-in trainings). Its face, what the other wings may import: the job itself and the
packages ``pack``, ``spread`` and ``workloads`` (each mechanism's registry and options); ``runtime`` and the modules
inside those packages are its own (pyproject.toml's protected contract). It imports nothing here: a training's
process loads only what it uses.
"""

# The workload a Hydra launcher's job runs (runtime/hydra_job.py), by the dotted name a plan records for the job to
# load: the face names it, so no other wing spells a module inside the wing, as data or as an import
HYDRA_JOB = "gpupack.job.runtime.hydra_job"
