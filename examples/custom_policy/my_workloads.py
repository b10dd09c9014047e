"""A study's own workload: bursts of short chat turns over a steady stream of long documents."""


def chat_bursts(config, rng):
  """`config` is the run's workload section, `rng` a numpy Generator seeded by the run."""
  t = 0.0
  for i in range(config.num_requests):
    in_burst = (i // 8) % 2 == 0                  # 8 chat turns, then 8 documents, ...
    t += rng.exponential(0.02 if in_burst else 0.1)
    if in_burst:
      yield {"arrival_s": t, "prompt_len": int(rng.integers(16, 64)),
             "output_len": int(rng.integers(16, 48)), "session": f"chat-{i % 4}"}
    else:
      yield {"arrival_s": t, "prompt_len": int(rng.integers(256, 448)),
             "output_len": int(rng.integers(4, 16))}
