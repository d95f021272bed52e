"""StopSignals: the first signal asks for a stop, a second or the grace bound ends the step."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlctl.errors import Stopped
from rlctl.trainer.loops.stop import StopSignals


def _wait(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_the_first_signal_only_asks(signum):
    with StopSignals(grace_s=0) as stop:
        os.kill(os.getpid(), signum)
        _wait(0.1)
        assert stop.requested == signum
        err = stop.stopped(7)
    assert err.exit_code == 128 + signum and "step 7" in str(err)
    assert signal.getsignal(signal.SIGTERM) is not stop._handle  # handlers restored


def test_a_second_sigterm_aborts_with_143():
    with pytest.raises(Stopped) as caught, StopSignals(grace_s=0):
        os.kill(os.getpid(), signal.SIGTERM)
        _wait(0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        _wait(1.0)
    assert caught.value.exit_code == 143 and "second SIGTERM" in str(caught.value)


def test_a_second_ctrl_c_is_a_keyboard_interrupt():
    with pytest.raises(KeyboardInterrupt), StopSignals(grace_s=0):
        os.kill(os.getpid(), signal.SIGINT)
        _wait(0.1)
        os.kill(os.getpid(), signal.SIGINT)
        _wait(1.0)


def test_a_step_longer_than_the_grace_is_abandoned():
    start = time.monotonic()
    with pytest.raises(Stopped) as caught, StopSignals(grace_s=0.3):
        os.kill(os.getpid(), signal.SIGTERM)
        _wait(10.0)  # a step that would not finish in time
    assert time.monotonic() - start < 5
    assert caught.value.exit_code == 143 and "stop_grace_s = 0.3" in str(caught.value)
