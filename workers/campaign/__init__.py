"""The GPU campaign (`pipetune campaign`): what a lent GPU runs to turn minutes of device
time into all the evidence pipetune needs, resumable across calls on fresh machines.

- workers.campaign.run: the phases in order, the summary, the exit status;
- layout, packer: the files, the ``--have`` folder or archive, the archive kept current;
- correctness, profile_phase, baselines, sweeps: one phase each;
- cuda_side / sim_side: the probe's and the baselines' child-process functions on a GPU,
  and their simulated twins; checks: the library checks both run;
- plan: the time plan (``pipetune campaign plan``); operators: what is swept, in which order;
- kit: ``make gpu-kit`` (the wheels the GPU machine lacks, and the device command);
- unpack: an archive into benchmarks/data/<gpu>/ and model/profiles/<gpu>.json.

The GPU side imports CuPy, PyTorch, pydantic and the kernel toolchain, never the service,
the database, XGBoost or the web stack.
"""

from pipetune.workers.campaign.run import (
    RUNNERS,
    CampaignError,
    CampaignOptions,
    CampaignOutcome,
    CampaignUsageError,
    run_campaign,
)

__all__ = [
    "RUNNERS",
    "CampaignError",
    "CampaignOptions",
    "CampaignOutcome",
    "CampaignUsageError",
    "run_campaign",
]
