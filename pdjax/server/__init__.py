"""The OpenAI-compatible server (python -m pdjax.serve) and its parts.

`app`: the HTTP endpoints (FastAPI); `protocol`: the OpenAI request bodies checked and turned
into token ids and sampling; `driver_bridge`: DriverBridge, the online bridge from the HTTP
handlers to the driver, running on the wall clock in its own thread; `http_server`: uvicorn's
server draining on a signal, and the engine built behind an open socket; `text_stream`: a
request's text a piece per token, with stop strings; `startup`: the start-up's progress for
stderr and /health; `prometheus`: the /metrics counters under vLLM's names.
"""
