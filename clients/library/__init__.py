"""The library behind `pipetune.tune`, `pipetune.best_schedule`, `pipetune.kernel` and
`pipetune export`, one job per module:

- inputs: what the public functions accept (workloads, GPUs, schedules);
- store: the local database read as the service answers (LocalStore);
- lookup: the best known schedule (pipetune.best_schedule);
- tuning: tuning in process through the service's driver and queue (pipetune.tune);
- arrays, frameworks, cuda_launch, kernel: a tuned kernel as a callable (pipetune.kernel);
- exports: tuned kernels and a task's trials as files (pipetune export);
- labels: how simulated results are labelled.

Nothing is imported here: each module loads what it needs (`import pipetune` stays light).
"""
