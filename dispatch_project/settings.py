"""Django settings for LLM Dispatch, read once from the environment (django-environ).

Every setting has an embedded default so that a fresh checkout runs with no configuration:
SQLite and the project data directory under ``var/``, a private Valkey server, and the ClickHouse
engine in-process through chDB. See the README's settings table.
"""

import socket
from pathlib import Path

import environ

from runtime.valkey.locate import DEFAULT_DATA_DIR

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

# Scripts find the embedded Valkey under the same directory (runtime.valkey.locate.installation_url).
DISPATCH_DATA_DIR = Path(env.str("DISPATCH_DATA_DIR", default=str(DEFAULT_DATA_DIR))).resolve()

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="dev-only-insecure-key-change-me-in-production-0123456789")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list(
    "DJANGO_CSRF_TRUSTED_ORIGINS", default=["http://127.0.0.1:8000", "http://localhost:8000"]
)
# The production profile (docs/deploy.md): DEBUG off turns these on behind a TLS-terminating proxy
# that sets X-Forwarded-Proto (and overwrites any a client sent); each can still be set on its own.
if env.bool("DJANGO_BEHIND_TLS_PROXY", default=not DEBUG):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=not DEBUG)
# The development defaults of these three still in force: the deploy check dispatch.W002 names them.
DEVELOPMENT_DEFAULTS_IN_USE = tuple(
    name
    for name in ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DJANGO_CSRF_TRUSTED_ORIGINS")
    if name not in env.ENVIRON
)
SILENCED_SYSTEM_CHECKS = env.list("DJANGO_SILENCED_SYSTEM_CHECKS", default=[])

# Empty means: start (or reuse) the embedded Valkey server under DISPATCH_DATA_DIR.
VALKEY_URL = env.str("VALKEY_URL", default="")
# How often the embedded Valkey fsyncs its append-only file: always, everysec (a crash loses at most
# about a second of writes; durable pushes wait for the fsync) or no (the kernel decides).
DISPATCH_VALKEY_APPENDFSYNC = env.str("DISPATCH_VALKEY_APPENDFSYNC", default="everysec")
DISPATCH_KEY_PREFIX = env.str("DISPATCH_KEY_PREFIX", default="")
CLICKHOUSE_URL = env.str("CLICKHOUSE_URL", default=f"chdb://{DISPATCH_DATA_DIR / 'clickhouse'}")
HISTORY_RETENTION_DAYS = env.int("HISTORY_RETENTION_DAYS", default=30)
HISTORY_STORE_CONTENT = env.bool("HISTORY_STORE_CONTENT", default=False)

DISPATCH_PRODUCER_ALIVE_TTL_S = env.float("DISPATCH_PRODUCER_ALIVE_TTL_S", default=12.0)
DISPATCH_PRODUCER_ALIVE_REFRESH_S = env.float("DISPATCH_PRODUCER_ALIVE_REFRESH_S", default=3.0)
DISPATCH_MAX_ENVELOPE_BYTES = env.int("DISPATCH_MAX_ENVELOPE_BYTES", default=8 * 1024 * 1024)
DISPATCH_CONCURRENCY = env.int("DISPATCH_CONCURRENCY", default=64)
DISPATCH_SHUTDOWN_GRACE_S = env.float("DISPATCH_SHUTDOWN_GRACE_S", default=30.0)
DISPATCH_LEASE_S = env.float("DISPATCH_LEASE_S", default=15.0)
DISPATCH_BACKEND_TIMEOUT_S = env.float("DISPATCH_BACKEND_TIMEOUT_S", default=120.0)
# A Valkey that leaves a command unanswered this long (stopped, partitioned away) counts as lost: every
# process (dispatchers, producers, the web) fails the command and reconnects instead of hanging.
DISPATCH_VALKEY_HEALTH_S = env.float("DISPATCH_VALKEY_HEALTH_S", default=5.0)
DISPATCH_COST_PER_IMAGE = env.int("DISPATCH_COST_PER_IMAGE", default=2)
DISPATCH_COST_PER_PAGE = env.int("DISPATCH_COST_PER_PAGE", default=1)
DISPATCH_COST_MAX = env.int("DISPATCH_COST_MAX", default=64)
# The gateway identity every dispatcher span carries (rundispatcher --gateway-id overrides it).
DISPATCH_GATEWAY_ID = env.str("DISPATCH_GATEWAY_ID", default="") or socket.gethostname()
# OpenAI-compatible ingress: a revoked key is refused within the cache time; the deadline when the
# request has no X-Dispatch-Timeout header.
INGRESS_KEY_CACHE_S = env.float("INGRESS_KEY_CACHE_S", default=1.0)
INGRESS_DEFAULT_TIMEOUT_S = env.float("INGRESS_DEFAULT_TIMEOUT_S", default=120.0)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "pools",
    "history",
    "dashboard",
    "ops",
    "ingress",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "dispatch_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "dispatch_project.wsgi.application"
ASGI_APPLICATION = "dispatch_project.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{DISPATCH_DATA_DIR / 'db.sqlite3'}")}

# Hosts are filled in at start-up by pools.connections, once the Valkey URL is known.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "dashboard.layer.RedisChannelLayer",  # channels-redis that reconnects
        "CONFIG": {"hosts": [], "prefix": f"{DISPATCH_KEY_PREFIX}asgi", "capacity": 500, "expiry": 30},
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(DISPATCH_DATA_DIR / "static")))
if not DEBUG:
    # Production: WhiteNoise serves what `collectstatic` gathered, under hashed names cached for a year
    # (in DEBUG the ASGI app's static handler serves the apps' files as they are).
    MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                      "whitenoise.middleware.WhiteNoiseMiddleware")  # fmt: skip
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/admin/login/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("DISPATCH_LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}
