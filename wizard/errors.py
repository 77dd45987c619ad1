"""One exception class per kind of failure, each carrying its exit code (CONTRACT §5)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FINDINGS = 1
    USAGE = 2
    INTERNAL = 3
    INTERRUPTED = 130


class NNWizardError(Exception):
    """Base class: the message is shown to the user as one clear paragraph."""

    exit_code = ExitCode.INTERNAL


class UsageError(NNWizardError):
    """A bad flag or flag value."""

    exit_code = ExitCode.USAGE


class TargetError(NNWizardError):
    """The user's module cannot be imported, lacks a required name, or fails while being built."""

    exit_code = ExitCode.USAGE


class TreeError(NNWizardError):
    """A decision tree or the hypothesis catalog is malformed."""

    exit_code = ExitCode.USAGE


class AnswersError(NNWizardError):
    """The --answers file is malformed or names unknown questions."""

    exit_code = ExitCode.USAGE


class NeedsAnswer(NNWizardError):
    """A question has no default and no answer while running without a terminal."""

    exit_code = ExitCode.USAGE


class ProbeNotFound(NNWizardError):
    exit_code = ExitCode.USAGE
