"""Batching and GPU workers: the batch queue (the batching window), workers, the dynamic
fleet, traffic classes, dispatch across versions' pools, autoscalers.
"""
