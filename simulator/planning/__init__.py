"""Questions asked of many runs: plans, sweeps, replications, fleet sampling, napkin math
and the run budget.
"""
