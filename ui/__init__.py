"""The Gradio app of CSD Explorer: ``build_demo(services)`` and the pieces it is made of.

``ui`` uses ``csd`` (the engine) and ``db`` (the store); neither imports ``ui``.
"""
from .app import build_demo, launch_kwargs, theme
from .state import Services, Session, Settings, make_services

__all__ = ["build_demo", "launch_kwargs", "theme", "Services", "Session", "Settings", "make_services"]
