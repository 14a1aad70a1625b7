"""The Gradio app of CSD Explorer: ``build_demo(services)`` and the pieces it is made of."""
from .app import build_demo, launch_kwargs
from .state import Services, Settings, make_services

__all__ = ["build_demo", "launch_kwargs", "Services", "Settings", "make_services"]
