"""Admin forms whose formsets check the group rules with every submitted row at once.

Validating each pool against the stored values of its siblings would refuse valid batch edits (lower
one pool's protected slots, raise another's) and accept invalid ones; so the per-row forms skip the
group rules and the formset checks them over the submitted values.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet, BaseModelFormSet

from pools import selectors
from pools.models import FabricGroup, Pool
from pools.validation import group_problems, pool_values


class GroupRulesInFormSetMixin(forms.ModelForm):
    """A model form whose instance leaves the group rules to its formset."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.instance.skip_group_check = True


class FabricGroupForm(GroupRulesInFormSetMixin):
    class Meta:
        model = FabricGroup
        fields = "__all__"


class PoolRowForm(GroupRulesInFormSetMixin):
    class Meta:
        model = Pool
        fields = "__all__"


def _kept_forms(formset: Any) -> list[forms.ModelForm]:
    kept = []
    for form in formset.forms:
        if form.instance._state.adding and not form.has_changed():
            continue  # an untouched extra row
        if formset.can_delete and formset._should_delete_form(form):
            continue
        kept.append(form)
    return kept


class _PoolFormSetMixin:
    def get_unique_error_message(self, unique_check: Any) -> str:
        if tuple(unique_check) == ("pool_id",):
            return "Two rows use the same pool id; pool ids are lane ids and must be unique."
        return super().get_unique_error_message(unique_check)  # type: ignore[misc]


class PoolInlineFormSet(_PoolFormSetMixin, BaseInlineFormSet):
    """The pools edited under their group: the group rules over the submitted rows and total."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        group: FabricGroup = self.instance
        if not group.total_concurrency or group.total_concurrency < 1 or not group.policy:
            return  # the group form reports its own invalid fields
        rows = [pool_values(form.instance) for form in _kept_forms(self)]
        problems = group_problems(policy=group.policy, total_concurrency=group.total_concurrency, pools=rows)
        if problems:
            raise ValidationError(problems)


class PoolChangelistFormSet(_PoolFormSetMixin, BaseModelFormSet):
    """The list-editable rows: each touched group is checked with its stored pools overlaid by the rows."""

    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        submitted: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for form in self.forms:
            if form.has_changed():
                submitted[form.instance.group_id][form.instance.pk] = pool_values(form.instance)
        problems: list[str] = []
        for group_id, rows in sorted(submitted.items()):
            group = selectors.group_get(group_id=group_id)
            values = [rows.get(p.pk, pool_values(p)) for p in selectors.group_pools(group=group)]
            found = group_problems(
                policy=group.policy, total_concurrency=group.total_concurrency, pools=values
            )
            problems.extend(f"group {group_id!r}: {problem}" for problem in found)
        if problems:
            raise ValidationError(problems)
