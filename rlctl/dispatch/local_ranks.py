"""Ranks on this machine outside the worker pool: ``world`` spawned processes (``rlctl bench reshard``,
multi-rank engine checks) that leave as soon as their work is done.

A rank whose function returned has written what it had to (files closed, process group destroyed),
so it exits at once with ``os._exit(0)`` instead of tearing the interpreter down. That teardown
destroys the C++ threads of gloo and of the rendezvous store from static destructors, where a
finished process can abort (pytorch/pytorch#179291 traces one such SIGABRT to gloo's worker threads
at interpreter finalization); a two-rank gloo check of rlctl's aborted once with "terminate called
without an active exception", the message of a thread destroyed unjoined. A rank that raises goes
through ``torch.multiprocessing``'s own error path (its traceback reaches the caller).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any


def spawn_ranks(fn: Callable[..., Any], world: int, args: tuple = ()) -> None:
    """Run ``fn(rank, *args)`` in ``world`` fresh processes and wait for all of them; the first that
    fails raises here (``torch.multiprocessing.ProcessRaisedException``, or ``ProcessExitedException``
    for one that died). ``fn`` and ``args`` must pickle (a module-level function)."""
    import torch.multiprocessing as mp

    mp.spawn(_leave_when_done, args=(fn, args), nprocs=world, join=True)


def _leave_when_done(rank: int, fn: Callable[..., Any], args: tuple) -> None:
    fn(rank, *args)
    logging.shutdown()  # flush handlers; nothing else of the interpreter's teardown is wanted
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
