"""A tiny real LLM engine to calibrate the simulator's LLM model against (issue 30).

A small torch decoder with random weights (nothing downloaded) served with the machinery
of a real engine, written here and independent of the simulator's scheduler:

- :mod:`.model`: the decoder, its attention over a paged KV cache (block tables, keys and
  values gathered from the blocks), and a dense reference to check it against;
- :mod:`.blocks`: the block manager: free queue, reference counts, a prefix cache of
  chained block hashes with LRU eviction;
- :mod:`.engine`: the scheduler and the step loop: continuous batching with chunked
  prefill, FCFS admission, preemption by recompute, greedy sampling, per-step timings;
- :mod:`.worker`: the engine in a process of its own, and the front end's client of it;
- :mod:`.api`: an OpenAI-compatible HTTP API (``/v1/completions``,
  ``/v1/chat/completions``, ``/v1/models``) streamed as SSE, and ``/metrics`` with vLLM's
  metric names and buckets.
"""
