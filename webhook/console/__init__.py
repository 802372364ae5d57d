"""The console: pages under /ui/ for a project's scheduling offer and GPUs and the admin's Run:ai
departments and projects (see `pages.py`)."""

from webhook.console.pages import Console, console_routes

__all__ = ["Console", "console_routes"]
