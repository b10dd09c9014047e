"""A stand-in for the Azure LLM inference traces of 2023, in their CSV format, for timing the
simulator at hour scale on a machine without the real files (nothing is downloaded here).

  python benchmarks/azure_standin.py --kind=conv --out=/tmp/azure_conv_standin.csv
  python benchmarks/azure_standin.py --kind=code --out=/tmp/azure_code_standin.csv

Same columns as the published files (TIMESTAMP, ContextTokens, GeneratedTokens), so
`workload.kind=azure --config.workload.path=FILE` reads either, and the real trace replaces
this one by changing the path. What is matched is the published size and length statistics,
not the trace itself: the conversation trace holds 19,366 requests over one hour; lengths are
log-normal with the medians and means reported for the 2023 traces (conversation: prompt
median 1,020 / mean 1,155 tokens, output median 129 / mean 211; code: prompt median 1,500 /
mean 2,048, output median 13 / mean 28). Arrivals are bursty: a gamma renewal process with a
coefficient of variation of 2 (the real trace's burstiness differs by minute).

The real traces can now be used instead (issue 49, item 4). The repository ships the first
1,000 rows of each, with their source, license (CC BY 4.0) and attribution, in
tests/fixtures/azure_llm_2023/ (code_first_1000.csv, conv_first_1000.csv); the whole files are
data/AzureLLMInferenceTrace_{code,conv}.csv of https://github.com/Azure/AzurePublicDataset
(8,819 and 19,366 rows, ~1 hour each). Either is read by path, as this file is:

  python -m pdjax.run --config.backend=sim --config.workload.kind=azure \
      --config.workload.num_requests=0 --config.workload.path=AzureLLMInferenceTrace_conv.csv
  python -m pdjax.plan --config=configs/where_disagg_wins.py:quick \
      --config.plan.map_mixes=azure_conv,workload --config.workload.kind=azure \
      --config.workload.path=AzureLLMInferenceTrace_conv.csv

(the map's `workload` mix: the trace's lengths at the map's Poisson rates; BENCHMARKS.md, "A real
trace mix (Azure 2023)"). This stand-in remains for sizes the real hour does not have
(--hours).
"""

import argparse
import datetime
import math
import random

STATS = {   # kind: (requests in the hour, prompt median, prompt mean, output median, output mean)
    "conv": (19366, 1020, 1155, 129, 211),
    "code": (8819, 1500, 2048, 13, 28),
}


def lognormal(rng: random.Random, median: float, mean: float, cap: int) -> int:
  sigma = math.sqrt(2 * math.log(mean / median))
  return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--kind", choices=sorted(STATS), default="conv")
  parser.add_argument("--out", required=True)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--hours", type=float, default=1.0)
  parser.add_argument("--max_len", type=int, default=8192, help="cap on either length")
  args = parser.parse_args()
  rng = random.Random(args.seed)
  count, p_med, p_mean, o_med, o_mean = STATS[args.kind]
  count = round(count * args.hours)
  mean_gap, cv = 3600.0 * args.hours / count, 2.0
  shape = 1 / cv ** 2
  t = datetime.datetime(2023, 11, 16, 18, 0, 0)
  with open(args.out, "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for _ in range(count):
      t += datetime.timedelta(seconds=rng.gammavariate(shape, mean_gap / shape))
      f.write(f"{t.isoformat(sep=' ')},{lognormal(rng, p_med, p_mean, args.max_len)},"
              f"{lognormal(rng, o_med, o_mean, args.max_len)}\n")
  print(f"{count} {args.kind} requests over {args.hours:g} h -> {args.out}")


if __name__ == "__main__":
  main()
