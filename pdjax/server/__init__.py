"""The OpenAI-compatible server (python -m pdjax.serve) and its parts.

In the HTTP process: `app`: the HTTP endpoints (FastAPI); `protocol`: the OpenAI request bodies
checked and turned into token ids and sampling; `http_server`: uvicorn's server draining on a
signal; `engine_client`: EngineClient, the link to the engine-core process. In the engine-core
process: `engine_core`: the process's side of the link; `serve_plan`: what pdjax.serve's
engine process loads, builds and writes; `driver_bridge`: DriverBridge, the driver on the wall
clock in its own thread (also usable in one process: the tests' fake engines); `text_stream`: a
request's text a piece per token, with stop strings; `prometheus`: the /metrics counters under
vLLM's names. Both: `engine_api` (what a handler sees of an engine), `startup` (the start-up's
progress for stderr and /health).
"""
