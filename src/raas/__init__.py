"""raas: Rollout-as-a-Service for RL training of multi-turn LLM agents.

Three parts, each its own package: ``raas.service`` (rollout service: INIT/RUN/EVAL over HTTP),
``raas.trainer`` (PyTorch policy updates) and ``raas.coordinator`` (the async loop joining them).
``raas.contracts`` holds what they exchange.
"""

__version__ = "0.1.0"
