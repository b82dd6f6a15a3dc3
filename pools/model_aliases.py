"""Model aliases: a model name a client sends that routes to a pool without any header (issue 24).

LiteLLM's ``model_list`` maps a public model name to a deployment; here a group's alias maps a
request's ``model`` (e.g. ``batch/llama-3-8b``) to one of its pools and to the model name the backend
knows (``meta-llama/Llama-3-8B-Instruct``). Aliases are published with the group's configuration;
the ingress reads them from there.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import models

# What OpenAI and Hugging Face model names look like: no spaces or control characters.
ALIAS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")


def validate_model_name(value: str) -> None:
    if not ALIAS_RE.fullmatch(value or ""):
        raise ValidationError(
            "%(value)r is not a model name: use 1-200 letters, digits or . _ : / @ + -, "
            "starting with a letter or digit.",
            code="invalid_model_name",
            params={"value": value},
        )


class ModelAlias(models.Model):
    """One alias of a group: requests whose ``model`` is ``alias`` go to ``pool`` as ``backend_model``."""

    group = models.ForeignKey("pools.FabricGroup", on_delete=models.CASCADE, related_name="aliases")
    alias = models.CharField(
        max_length=200,
        unique=True,
        validators=[validate_model_name],
        error_messages={"unique": "This alias already exists (aliases are names over the whole fleet)."},
        help_text="The model name clients send, e.g. batch/llama-3-8b.",
    )
    pool = models.ForeignKey(
        "pools.Pool",
        on_delete=models.CASCADE,
        related_name="aliases",
        help_text="The pool (of this group) its requests go to.",
    )
    backend_model = models.CharField(
        "backend model",
        max_length=200,
        blank=True,
        validators=[validate_model_name],
        help_text="The model name sent to the backend, e.g. meta-llama/Llama-3-8B-Instruct. "
        "Blank: the alias itself.",
    )

    class Meta:
        ordering = ("alias",)
        verbose_name = "model alias"
        verbose_name_plural = "model aliases"

    def __str__(self) -> str:
        return f"{self.alias} -> {self.pool_id}"

    @property
    def sent_model(self) -> str:
        return self.backend_model or self.alias

    def clean(self) -> None:
        super().clean()
        if self.pool_id is not None and self.group_id is not None and self.pool.group_id != self.group_id:
            raise ValidationError({"pool": "The pool must be one of this group's pools."})
