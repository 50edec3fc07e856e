"""Exceptions of the driver. Each one a user can cause carries a message they can act on."""

from __future__ import annotations


class PgtickError(Exception):
    """Base class: an error the CLI reports as one line (exit code 1)."""


class UsageError(PgtickError):
    """The command line or an argument is wrong (exit code 2)."""


class JobStopped(BaseException):
    """Raised at a checkpoint to stop job code. A BaseException so that a job's
    ``except Exception`` does not swallow it by accident."""


class Cancelled(JobStopped):
    """Cancellation of this run was requested (jobs.cancel); the run ends CANCELLED."""


class Abandoned(JobStopped):
    """This worker no longer owns the run (it was reaped or fenced); nothing is reported."""


class JobTimeout(Exception):
    """The run exceeded its timeout; it fails with failure_reason 'Timeout'."""
