"""pgtick inside frameworks: ``pgtick.contrib.asgi`` (FastAPI, Starlette and any ASGI app with
a lifespan), ``pgtick.contrib.django`` (an installable Django app), ``pgtick.contrib.otel``."""
