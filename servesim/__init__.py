"""The ``servesim`` command line: a thin face over :mod:`simulator` (the model),
:mod:`calibrate` (measuring a real server), :mod:`reference_server` and the dashboards.

Nothing in :mod:`simulator` imports this package or the others; this one imports them all.
"""
