"""Errors a user can act on, and how their one line reaches the user."""

import json
import os
import sys
import time

# sysexits.h's EX_IOERR ("an error occurred while doing I/O on some file"): a write did not fit
# on its filesystem (ENOSPC, EDQUOT); earlier checkpoints are intact and resume=auto goes on.
DISK_FULL_EXIT_CODE = 74


class UsageError(Exception):
    """Bad input: the CLI prints ``ddprl: error: <message>`` (one line) and exits with code 2."""


class DiskFull(Exception):
    """A file of the run did not fit (no space left, or a quota reached): the partial file is gone,
    the CLI prints ``ddprl: error: <message>`` (one line, naming the path and the bytes) and exits
    with :data:`DISK_FULL_EXIT_CODE`."""


def first_process() -> bool:
    """Whether this process is the first of its job (rank 0 under torchrun or srun, the only
    one otherwise): what the whole job has to say is said by it alone."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def say_once(line: str, first: bool) -> None:
    """``line`` to the user once per job: printed by the ``first`` process, and written by every
    process to torchrun's error file (TORCHELASTIC_ERROR_FILE), whose failure summary then shows
    this line instead of a link to its docs, on every machine of the job."""
    if first:
        print(line, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    message = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}
    try:
        with open(error_file, "w") as f:
            json.dump({"message": message}, f)
    except OSError:
        pass  # the line printed (or the first process's) says it already
