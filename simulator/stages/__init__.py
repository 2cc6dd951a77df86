"""The request path outside the batcher: arrivals, the canary and shadow split, caches,
feature fetch, FCFS stations (network, router, pre/postprocessing) and the prediction
log.
"""
