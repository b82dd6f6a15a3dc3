from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from pools.checks import TAG, check_fabric_groups, check_valkey_url

        checks.register(check_fabric_groups, TAG)
        checks.register(check_valkey_url, TAG)
