"""What serves a model, started: its instances (processes spawned together, then awaited;
or threads) and the dynamic batcher over them. A single front end starts them for
itself (:mod:`reference_server.frontend`); with several front ends the hub does
(:mod:`reference_server.hub`).
"""

from __future__ import annotations

from reference_server.batcher import DynamicBatcher
from reference_server.config import ServerConfig
from reference_server.instances import InstanceSpec, ProcessInstance, ThreadInstance, blocks
from reference_server.models import ServedModel


def start_instances(cfg: ServerConfig, front: ServedModel, cores: list[int | None]) -> list:
    """Start the model instances (processes: spawned together, then awaited)."""
    if cfg.instance_mode == "thread":
        return [ThreadInstance(k, front, core) for k, core in enumerate(cores)]
    layout_in, layout_out = blocks(front, cfg.max_batch_size)
    started = []
    try:
        for k, core in enumerate(cores):
            spec = InstanceSpec(
                index=k,
                model=cfg.model,
                max_batch_size=cfg.max_batch_size,
                inputs=layout_in,
                outputs=layout_out,
                core=core,
                threads=cfg.threads,
                device=None,
                warmup_batches=cfg.warmup_batches,
                idle=cfg.instance_idle,
            )
            started.append(ProcessInstance(spec))
        for inst in started:
            inst.wait_ready()
    except BaseException:
        for inst in started:
            inst.close(timeout_s=2)
        raise
    return started


def batcher_for(cfg: ServerConfig, instances: list, on_batch) -> DynamicBatcher:
    """The dynamic batcher ``cfg`` asks for, over ``instances`` (a front end's, or the hub's)."""
    return DynamicBatcher(
        instances,
        max_batch_size=cfg.max_batch_size,
        max_queue_delay_ms=cfg.max_queue_delay_ms,
        max_queue_size=cfg.max_queue_size,
        on_batch=on_batch,
    )
