"""The web console: server-rendered pages over a MessageBox (overview, subscriptions,
the suspended queue with resume and terminate, messages, routing explanations).

``create_app(box, token=...)`` makes the Starlette application (:mod:`.app`); the
``messagebox console`` command serves it with uvicorn (:mod:`.cli`).
"""

from messagebox.console.app import create_app

__all__ = ["create_app"]
