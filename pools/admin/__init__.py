"""Admin for backends, fabric groups and pools. Writes go through pools.services, reads through
pools.selectors; once the admin's transaction commits, the affected groups are republished to
Valkey, and a failed publication is shown as a warning (the database write stands).

Django's admin autodiscover imports ``pools.admin``: importing the submodules here registers their
ModelAdmins (groups and pools in ``groups``, backends in ``backends``); the dead-letter pages and the
What-if panel are mixins of the pool and group admins (``dead_letters``, ``whatif``), and the
publication messages they all show are in ``publication``."""

from pools.admin import backends, groups  # noqa: F401  (registers the ModelAdmins)
