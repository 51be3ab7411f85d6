"""kvwatch.server: the OpenAI-compatible HTTP front of the reference engine."""

from kvwatch.server.app import ServerSettings, create_app
from kvwatch.server.worker import EngineWorker

__all__ = ["EngineWorker", "ServerSettings", "create_app"]
