"""What a scenario is: its config models, the YAML loader, the GPU catalog and types,
distributions, traffic shapes and batch service-time models.
"""
