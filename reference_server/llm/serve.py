"""``servesim serve-llm``: the tiny LLM engine behind an OpenAI-compatible API."""

from __future__ import annotations

from typing import Annotated

import typer

from reference_server.bodies import BodyLimits
from reference_server.serve import BodyMinRate, BodyTimeout, listen


def serve_llm(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (0: any free one).", min=0, max=65535)] = 8000,
    layers: Annotated[int, typer.Option(help="Decoder layers.")] = 2,
    width: Annotated[int, typer.Option(help="Model width (hidden size).")] = 128,
    heads: Annotated[int, typer.Option(help="Attention heads (width must divide by them).")] = 4,
    max_model_len: Annotated[int, typer.Option(help="Longest sequence, prompt and output, in tokens.")] = 2048,
    dtype: Annotated[str, typer.Option(help="float32, float64, float16 or bfloat16.")] = "float32",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    num_blocks: Annotated[int, typer.Option(help="KV cache blocks (vLLM's num_gpu_blocks).")] = 512,
    block_size: Annotated[int, typer.Option(help="Tokens a KV block holds.")] = 16,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Most tokens in one step.")] = 512,
    max_num_seqs: Annotated[int, typer.Option(help="Most sequences running at once.")] = 64,
    long_prefill_token_threshold: Annotated[
        int, typer.Option(help="Most tokens of one prompt in a step (0: no cap).")
    ] = 0,
    prefix_caching: Annotated[bool, typer.Option(help="Keep full blocks' content for later prompts.")] = True,
    device: Annotated[str, typer.Option(help="cpu, or cuda when a GPU is there.")] = "cpu",
    threads: Annotated[int, typer.Option(help="torch intra-op threads of the engine on the CPU.", min=1)] = 1,
    engine_core: Annotated[
        str,
        typer.Option(help="The engine's core: auto (the last, when one is left for the front end), none, or a number."),
    ] = "auto",
    idle: Annotated[
        str,
        typer.Option(help="The engine idle: sleep (on its pipe), or spin (poll it, keeping its core busy)."),
    ] = "sleep",
    served_model_name: Annotated[str, typer.Option(help="The model's name in the API.")] = "servesim-tiny",
    max_connections: Annotated[int, typer.Option(help="Open connections at most.", min=1)] = 512,
    header_timeout_s: Annotated[
        float, typer.Option(help="Seconds a client has to send its request.", min=0.001)
    ] = 10.0,
    body_timeout_s: BodyTimeout = BodyLimits.body_timeout_s,
    body_min_rate: BodyMinRate = BodyLimits.body_min_rate_bps,
) -> None:
    """Serve the tiny real LLM engine (paged KV cache, continuous batching, prefix cache,
    recompute preemption) with an OpenAI-compatible API and vLLM's /metrics."""
    import uvicorn

    from reference_server.connections import guarded_http
    from reference_server.llm.api import create_llm_app
    from reference_server.llm.engine import EngineConfig
    from reference_server.llm.model import DecoderConfig

    if idle not in ("sleep", "spin"):
        typer.echo(f"error: --idle must be sleep or spin, not {idle!r}", err=True)
        raise typer.Exit(code=2)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            typer.echo("error: --device cuda: no CUDA device is visible", err=True)
            raise typer.Exit(code=2)
    elif device != "cpu":
        typer.echo(f"error: --device must be cpu or cuda, not {device!r}", err=True)
        raise typer.Exit(code=2)
    try:
        model = DecoderConfig(
            width=width, layers=layers, heads=heads, ffn=4 * width, max_model_len=max_model_len, seed=seed, dtype=dtype
        )
        cfg = EngineConfig(
            model,
            num_blocks,
            block_size,
            max_num_batched_tokens,
            max_num_seqs,
            long_prefill_token_threshold,
            prefix_caching,
            device,
        )
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    from reference_server.instances import instance_cores

    try:
        (core,) = instance_cores(engine_core, 1)
    except ValueError as err:
        typer.echo(f"error: {str(err).replace('--instance-cores', '--engine-core')}", err=True)
        raise typer.Exit(code=2) from None
    bodies = BodyLimits(body_timeout_s=body_timeout_s, body_min_rate_bps=body_min_rate)
    listener = listen(host, port)  # a port taken: one line, before the engine starts
    port = listener.getsockname()[1]  # the one it took, where --port 0 asked for any
    app = create_llm_app(cfg, served=served_model_name, threads=threads, core=core, idle=idle, bodies=bodies)
    typer.echo(
        f"servesim serve-llm: http://{host}:{port} {served_model_name}: {layers} layers x {width}, "
        f"{num_blocks} blocks of {block_size} tokens, max_num_batched_tokens {max_num_batched_tokens}, "
        f"max_num_seqs {max_num_seqs}, on {device}" + (f" (engine on core {core})" if core is not None else "")
    )
    http = guarded_http(max_connections, header_timeout_s)  # slow or idle clients cut off
    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=5, http=http, timeout_graceful_shutdown=5)
    with listener:
        uvicorn.Server(config).run(sockets=[listener])
