"""Contracts between the three parts of raas. Imports neither torch nor FastAPI."""

from raas.contracts.api import *  # noqa: F401,F403
from raas.contracts.trajectory import (  # noqa: F401
    Stage,
    Status,
    Timing,
    ToolCall,
    Trajectory,
    TrajectoryError,
    Turn,
)
