"""Simulator vs real engine on held-out workloads (issue 5's validation).

  python experiments/sim_validation/validate.py [--out=experiments/sim_validation/run]

1. Calibrates this machine (`python -m pdjax.calibrate`, the default config) into OUT/profile.json.
   The calibration's in-situ step uses the default workload with seed 1; none of the
   workloads below is that one.
2. For each held-out workload (different length mixes and rates), runs mode=compare
   (colocated, chunked, disaggregated) on the real engine, then on the simulator with that
   profile, then on the real engine again: the second real run is the noise floor (what this
   shared machine's drift alone does to the numbers).
3. Writes OUT/results.md (and .json): mean and p90 TTFT and TPOT and SLO attainment, the
   simulator's error against the first real run, and the rerun's.
ignore_eos=True on both backends (the simulator's tokens never end early). SLOs are tight
(TTFT 150 ms, TPOT 15 ms) so that attainment is not 100% everywhere.
"""

import argparse
import json
import os
import subprocess
import sys

WORKLOADS = {
    "mixed-r8": ["--config.workload.preset=mixed", "--config.workload.rate=8"],
    "mixed-r14": ["--config.workload.preset=mixed", "--config.workload.rate=14"],
    "chat-r12": ["--config.workload.preset=chat", "--config.workload.rate=12"],
    "longdoc-r3": ["--config.workload.preset=long_doc_qa", "--config.workload.rate=3",
                   "--config.workload.num_requests=32"],
}
COMMON = ["--config.workload.ignore_eos=True", "--config.progress=False",
          "--config.slo.ttft_s=0.15", "--config.slo.tpot_s=0.015"]
RUNS = ("colocated", "chunked", "disaggregated")


def run(args: list[str]) -> None:
  cmd = [sys.executable, "-m"] + args
  print("+", " ".join(cmd), file=sys.stderr, flush=True)
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def metrics(folder: str) -> dict:
  out = {}
  for r in RUNS:
    with open(os.path.join(folder, r, "summary.json")) as f:
      s = json.load(f)
    out[r] = {"ttft_mean": s["ttft_s"]["mean"], "ttft_p90": s["ttft_s"]["p90"],
              "tpot_mean": s["tpot_s"]["mean"], "tpot_p90": s["tpot_s"]["p90"],
              "attainment": s["slo_attainment"]}
  return out


def error_row(ref: dict, other: dict) -> dict:
  row = {k: 100 * (other[k] / ref[k] - 1) for k in ("ttft_mean", "ttft_p90", "tpot_mean",
                                                    "tpot_p90")}
  row["attainment_pts"] = 100 * (other["attainment"] - ref["attainment"])
  return row


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="experiments/sim_validation/run")
  out = parser.parse_args().out
  os.makedirs(out, exist_ok=True)
  profile = os.path.join(out, "profile.json")
  run(["pdjax.calibrate", f"--out={profile}"])
  results = {}
  for name, flags in WORKLOADS.items():
    folders = {k: os.path.join(out, name, k) for k in ("real", "sim", "real_rerun")}
    run(["pdjax.run", *COMMON, *flags, f"--workdir={folders['real']}"])
    run(["pdjax.run", *COMMON, *flags, "--config.backend=sim",
         "--config.sim.cost_model=calibrated", f"--config.sim.profile={profile}",
         f"--workdir={folders['sim']}"])
    run(["pdjax.run", *COMMON, *flags, f"--workdir={folders['real_rerun']}"])
    results[name] = {k: metrics(v) for k, v in folders.items()}
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  lines = ["| workload | run | TTFT mean ms real / sim (err; rerun) | TTFT p90 ms | "
           "TPOT mean ms | TPOT p90 ms | attainment % real / sim (Δ pts; rerun) |",
           "|---|---|---|---|---|---|---|"]
  for name, res in results.items():
    for r in RUNS:
      real, sim, again = res["real"][r], res["sim"][r], res["real_rerun"][r]
      e, n = error_row(real, sim), error_row(real, again)
      cells = [f"{1e3 * real[k]:.1f} / {1e3 * sim[k]:.1f} ({e[k]:+.0f}%; {n[k]:+.0f}%)"
               for k in ("ttft_mean", "ttft_p90", "tpot_mean", "tpot_p90")]
      cells.append(f"{100 * real['attainment']:.1f} / {100 * sim['attainment']:.1f} "
                   f"({e['attainment_pts']:+.1f}; {n['attainment_pts']:+.1f})")
      lines.append(f"| {name} | {r} | " + " | ".join(cells) + " |")
  errors = [abs(error_row(res["real"][r], res["sim"][r])[k]) for res in results.values()
            for r in RUNS for k in ("ttft_mean", "tpot_mean")]
  noise = [abs(error_row(res["real"][r], res["real_rerun"][r])[k]) for res in results.values()
           for r in RUNS for k in ("ttft_mean", "tpot_mean")]
  att = [abs(error_row(res["real"][r], res["sim"][r])["attainment_pts"])
         for res in results.values() for r in RUNS]
  lines += ["", f"median |error| of means: simulator {sorted(errors)[len(errors) // 2]:.0f}%, "
            f"real rerun {sorted(noise)[len(noise) // 2]:.0f}%; "
            f"attainment |Δ| median {sorted(att)[len(att) // 2]:.1f} pts, max {max(att):.1f} pts"]
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
