"""Ctrl-C during training: the first stops the loop after its step (with a checkpoint), a second stops at once
(loop.py saves then; one during a weight update waits for its step to be whole: StopOnSigint.hold), and none cuts
the last checkpoint's write short.
SIGTERM (`kill PID`, a batch scheduler's time limit or preemption, `timeout`) is taken as a Ctrl-C: it killed the
process, losing every step since the last checkpoint, where a scheduler's grace period left time to save."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_said(signum) -> str:
    """How a message names the signal: Ctrl-C for SIGINT, else its name (SIGTERM)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class _OnSigint:
    """Inside `with`, Ctrl-C and SIGTERM call `_handler` instead of raising KeyboardInterrupt (SIGINT) or ending the
    process (SIGTERM); the handlers before are put back at the end. Signals reach the main thread only: elsewhere
    nothing is installed."""

    def __init__(self, say: Callable[[str], None]):
        self._say, self._previous = say, {}
        self.raised = None   # how the signal is said, once the handler has raised KeyboardInterrupt for it

    def _handler(self, signum, frame):  # pragma: no cover - each subclass has its own
        raise NotImplementedError

    def _interrupt(self, signum) -> KeyboardInterrupt:
        self.raised = signal_said(signum)
        return KeyboardInterrupt(self.raised)

    def as_interrupt(self, error: BaseException) -> KeyboardInterrupt | None:
        """The KeyboardInterrupt that `error` stands for, if this handler raised one that never arrived: numba,
        reading a compiled function's arguments, calls Python to check a typed List's type; a handler raising
        there makes that check fail, and numba raises TypeError("can't unbox a ... as a <NULL>") in the
        interrupt's place (the NULL is the type the check did not get). None: error is the error it says."""
        if self.raised is None or not (isinstance(error, TypeError) and "<NULL>" in str(error)):
            return None
        interrupt = KeyboardInterrupt(self.raised)
        interrupt.__cause__ = error
        return interrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        return False


class StopAtOnce(_OnSigint):
    """generate, eval and export: Ctrl-C and SIGTERM both raise KeyboardInterrupt naming the signal (SIGTERM ended
    the process at once, exit 143, where the help says 130 as for Ctrl-C)."""

    def __init__(self):
        super().__init__(lambda message: None)

    def _handler(self, signum, frame):
        raise self._interrupt(signum)


class StopOnSigint(_OnSigint):
    """First Ctrl-C (or SIGTERM): set `.requested` (the loop stops after the current step). Second:
    KeyboardInterrupt, at once or, inside `hold()`, at its end."""

    requested = False
    signum = 0   # the first one's signal number (SIGINT or SIGTERM): under MPI every rank is told which
    held = False
    pending = 0  # a second signal that came inside hold()

    def _handler(self, signum, frame):
        if self.requested:
            if self.held:
                self.pending = signum
                return
            raise self._interrupt(signum)  # the CLI says which: "stopped by SIGTERM"
        self.requested, self.signum = True, signum
        said = signal_said(signum)
        self._say(f"{said}: stopping after this step and writing a checkpoint ({said} again to stop now)")


    @contextlib.contextmanager
    def hold(self):
        """A second signal inside waits for the end, then raises there (a step's update, counters and log record
        are all done or none: train/step.py); an exception inside ends it with no wait."""
        self.held = True
        try:
            yield
        finally:
            self.held = False
        if self.pending:
            signum, self.pending = self.pending, 0
            raise self._interrupt(signum)


class FinishTheSave(_OnSigint):
    """While the last checkpoint is written: Ctrl-C waits for it (an interrupted write leaves no checkpoint, and
    the steps since the last one are lost), saying so once."""

    said = False

    def _handler(self, signum, frame):
        if not self.said:
            self.said = True
            self._say(f"{signal_said(signum)}: the checkpoint is being written; stopping as soon as it is complete")
