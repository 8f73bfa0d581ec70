"""The simulated engine (``slime engine --sim``): SGLang's HTTP subset with no model, for timing studies.

``SimEngine`` (engine.py) is the discrete-step core (usable in-process, no HTTP); ``SimEngineServer``
and ``main`` (server.py) serve it; ``SimConfig`` (config.py) holds the cost model and length
distribution; ``trajectory.py`` fixes each trajectory's length and tokens; ``stats.py`` the counters.
"""

from slime.servers.sim.config import SimConfig
from slime.servers.sim.engine import SimEngine, SimOutput
from slime.servers.sim.server import SimEngineServer, main
from slime.servers.sim.stats import SimStats

__all__ = ["SimConfig", "SimEngine", "SimOutput", "SimEngineServer", "SimStats", "main"]
