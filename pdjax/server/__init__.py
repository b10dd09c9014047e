"""The OpenAI-compatible server (python -m pdjax.serve) and its parts."""
