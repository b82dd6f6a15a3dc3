from django.apps import AppConfig


class IngressConfig(AppConfig):
    name = "ingress"
    verbose_name = "OpenAI-compatible ingress"
    default_auto_field = "django.db.models.BigAutoField"
