"""The simulated engine: the shared engine model (``model``: continuous batching over a KV pool, a pure
state machine with a step-time model calibrated from a profile), run in real time by the simulated
worker (``runner``) and in virtual time by the simulator, with its own deterministic tokenizer."""

from fairgate.workers.engines.simulated.adapters import AdapterSettings
from fairgate.workers.engines.simulated.model import EngineRequest, SimulatedEngine
from fairgate.workers.engines.simulated.plugin import SimulatedPlugin
from fairgate.workers.engines.simulated.steptime import StepTimeModel

__all__ = ["AdapterSettings", "EngineRequest", "SimulatedEngine", "SimulatedPlugin", "StepTimeModel"]
