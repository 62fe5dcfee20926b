"""Ctrl-C during training: the first stops the loop after its step (with a checkpoint), a second stops at once
(loop.py saves then unless a weight update was half-done), and none cuts the last checkpoint's write short."""
from __future__ import annotations

import signal
import threading
from typing import Callable


class _OnSigint:
    """Inside `with`, Ctrl-C calls `_handler` instead of raising KeyboardInterrupt; the handler before is put back
    at the end. Signals reach the main thread only: elsewhere nothing is installed."""

    def __init__(self, say: Callable[[str], None]):
        self._say, self._previous = say, None

    def _handler(self, signum, frame):  # pragma: no cover - each subclass has its own
        raise NotImplementedError

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class StopOnSigint(_OnSigint):
    """First Ctrl-C: set `.requested` (the loop stops after the current step). Second: KeyboardInterrupt."""

    requested = False

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._say("Ctrl-C: stopping after this step and writing a checkpoint (Ctrl-C again to stop now)")


class FinishTheSave(_OnSigint):
    """While the last checkpoint is written: Ctrl-C waits for it (an interrupted write leaves no checkpoint, and
    the steps since the last one are lost), saying so once."""

    said = False

    def _handler(self, signum, frame):
        if not self.said:
            self.said = True
            self._say("Ctrl-C: the checkpoint is being written; stopping as soon as it is complete")
