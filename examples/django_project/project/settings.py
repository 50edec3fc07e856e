"""Settings of the example project: one PostgreSQL database from DATABASE_URL, pgtick in it."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("DATABASE_URL", "dbname=shop"))

SECRET_KEY = "example-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["pgtick.contrib.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGTICK = {"APP": "shop.jobs:app", "DATABASE": "default"}
