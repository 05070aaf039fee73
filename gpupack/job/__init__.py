"""The job wing: what runs inside a job, from one pack down to the processes of its trainings.

Its order and face are docs/ARCHITECTURE.md's (and pyproject.toml's contracts). It imports nothing here: a training's
process loads only what it uses.
"""

# The workload a Hydra launcher's job runs, by the dotted name a plan records: the face names it, so no other wing
# spells a module inside the wing
HYDRA_JOB = "gpupack.job.runtime.hydra_job"
