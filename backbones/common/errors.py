"""The suite's error types: library code raises them with a message that names the file or value at fault and the
fix; the commands print them as one line (`backbones.common.commands.run_command`)."""


class SuiteError(Exception):
    """An error the suite explains in its message: bad input, a damaged file, a mismatch, with what to do."""


class UsageError(SuiteError, ValueError):
    """A command-line or configuration value outside its meaning (a size of 0, a device that is not there)."""


class TrackerError(UsageError):
    """An experiment tracker (Weights & Biases, MLflow) that cannot start its run."""


class DataError(SuiteError, ValueError):
    """A data set that is missing, damaged or does not match the model, checkpoint or labels."""


class CheckpointError(SuiteError, RuntimeError):
    """A checkpoint file that cannot be read, or whose weights do not fit the model."""


class CheckpointReadError(CheckpointError):
    """A checkpoint file that is missing or cannot be read at all (truncated, damaged, not a checkpoint)."""


class DivergedError(SuiteError, FloatingPointError):
    """A training loss that is not finite: the run stops at the update that gave it, naming what to change."""


class AlreadyDone(SuiteError):
    """What a command was asked to do is done already: one line, exit status 0, nothing written."""


class Interrupted(BaseException):
    """A run stopped on request (SIGTERM, SIGUSR1) after writing a checkpoint it resumes from; exit status 75. Not an
    Exception, as KeyboardInterrupt: code catching any exception must not take a stop for a fault of its own."""

    def __init__(self, message: str, exit_code: int = 75) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # 75, EX_TEMPFAIL: try again (a scheduler's requeue); 130 for Ctrl-C
