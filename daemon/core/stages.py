"""The stages as the engine runs them: each state's module (``STATE, ADOPTS, completed, run``),
its process spec (retries, backoff, timeout), and one attempt of it, whatever it raised
turned into an Outcome for the engine's queue.

Nothing here decides what an outcome leads to (``machine.decide`` does) or touches a file;
an attempt stops the strays a crashed daemon left that the round state will not adopt
(daemon/core/children.py), then runs the stage under its timeout.
"""

from __future__ import annotations

import math
from types import ModuleType

import anyio
import structlog

from shoprld.states import base, export_hf, gate, inject, next_round, preflight_disk, start_shopsim, train, val

from shoprld.daemon.foundation.storage import disk as diskmod
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.system.errors import ShoprldError
from shoprld.daemon.round.machine import ROUND_STATES, State
from shoprld.daemon.core.children import Children

log = structlog.get_logger("shoprld.engine")

#: Each working state's module, by the state it names.
MODULES: dict[State, ModuleType] = {
    m.STATE: m for m in (preflight_disk, start_shopsim, train, export_hf, val, gate, inject, next_round)
}


def spec_for(cfg: Config, state: State) -> ProcessSpec:
    """``state``'s retries, backoff and timeout (a state without a section: two retries)."""
    return {
        State.START_SHOPSIM: cfg.shopsim, State.TRAIN: cfg.train, State.EXPORT_HF: cfg.export,
        State.VAL: cfg.val, State.GATE: cfg.gate, State.INJECT: cfg.inject,
    }.get(state, ProcessSpec(retries=2))


async def attempt(state: State, ctx: base.RoundContext, spec: ProcessSpec,
                  kids: Children) -> base.Outcome | ShoprldError:
    """Run one attempt of ``state``'s stage. A stage's own error comes back as it is (the
    engine ends with its exit code); a timeout, an OSError or a stage bug as a retry (a full
    volume as ``disk``): a stage bug must not kill the campaign."""
    try:
        if state in ROUND_STATES:  # before, the round to resume (and its trainer) is not known
            await kids.stop_strays(MODULES[state].ADOPTS)
        with anyio.fail_after(spec.timeout or math.inf):
            outcome: base.Outcome = await MODULES[state].run(ctx)
            return outcome
    except ShoprldError as exc:
        return exc
    except TimeoutError:
        return base.Outcome.retry(f"{state.value} timed out after {spec.timeout:.0f}s")
    except OSError as exc:
        return base.Outcome("disk", str(exc)) if diskmod.is_enospc(exc) else \
            base.Outcome.retry(f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # logged, then retried
        log.exception("stage.crashed", state=state.value)
        return base.Outcome.retry(f"{type(exc).__name__}: {exc}")


class RunningStage:
    """The cancel scope of the one stage task that runs now (a shutdown cancels it)."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None

    def cancel(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
