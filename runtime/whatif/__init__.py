"""What-if: recorded traffic replayed through the real scheduler under a proposed configuration.

``trace`` (the recorded requests as arrays), ``workload`` (service model fitted on them), ``engine``
(the virtual-clock replay), ``changes`` (``pool.field=value`` edits), ``compare`` (both sides and the
text table). Pure: no clock, no I/O, no Django; history reads the arrivals, the admin and
``manage.py whatif`` call :func:`runtime.whatif.compare.what_if`.
"""
