"""moelab's embedded engine: a small Qwen3-MoE model behind an OpenAI-compatible server.

It exists so every moelab path runs on any machine and so moelab's own MoE kernels can be
measured in a real serving loop; it is small on purpose, not a production engine. Needs torch
(`pip install 'moelab[engine]'`). Module map:
    config.py      ModelConfig (HF Qwen3-MoE fields), presets tiny/small, ServerConfig, resolve() of `auto`
    tokenizer.py   tokenizer.json via `tokenizers`, or byte-level; ChatML prompt
    checkpoint.py  seeded random weights; HF-style directories written and read (ModelOpt fp8/NVFP4 too)
    model.py       the architecture: RMSNorm, rotary GQA attention with q/k norm, top-k router, MoE runner
    scheduler.py   continuous batching and KV slot reservation (plain Python)
    batch.py       one step's packed tensors;  sampling.py  next-token choice and logprobs
    detok.py       incremental text and stop strings;  runtime.py  the engine loop thread
    protocol.py    OpenAI request validation and response bodies;  server.py  aiohttp routes
    build.py       ServerConfig -> warmed-up Engine, logging `moelab.engine phase=<name>` lines
    memory.py      the memory forecast of one rank (weights, KV bytes per token)
    parallel/      --tp-size / --ep-size: which rank holds what, the rank processes, their collectives
"""
