"""The simulated engine (``slime engine --sim``): SGLang's HTTP subset with no model, for timing studies.

``SimEngine`` (engine.py) is the discrete-step core (usable in-process, no HTTP); ``SimEngineServer``
and ``main`` (server.py) serve it; ``SimConfig`` (config.py) holds the cost model and length
distribution; ``trajectory.py`` fixes each trajectory's length and tokens; ``stats.py`` the counters.
"""

from slime.rollout.sim.config import SimConfig
from slime.rollout.sim.engine import SimEngine, SimOutput
from slime.rollout.sim.server import SimEngineServer, main
from slime.rollout.sim.stats import SimStats

__all__ = ["SimConfig", "SimEngine", "SimOutput", "SimEngineServer", "SimStats", "main"]
