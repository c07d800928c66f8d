"""Engines behind the worker interface. The simulated engine is a pure state machine shared by the
offline simulator (virtual clock) and the real-time simulated worker (which sleeps each step)."""

from workers.engine.simulated import EngineRequest, FinishedRequest, SimulatedEngine, StepReport
from workers.engine.steptime import StepTimeModel

__all__ = ["EngineRequest", "FinishedRequest", "SimulatedEngine", "StepReport", "StepTimeModel"]
