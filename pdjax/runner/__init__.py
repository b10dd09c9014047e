"""One run as a library: build a run's instances, serve a workload on them, summarize and write it.

  build.py           the instances, policies and serve arguments of one run (build_run)
  serve_requests.py  serves a list of requests on one mode's instances with the driver and
                     checks the end-of-run invariants (serve, make_driver, check_end_state)
  execute.py         one run end to end: workload loaded once, served, summarized (execute)
  repeats.py         every run of a config, `repeats` times each (run_repeats)
  outputs.py         a run's folder and mode=compare's compare.md (write_outputs)
  sweep_points.py    a sweep's points: overrides applied, labels, their runs, its plots

The commands (`pdjax.run`, `pdjax.serve`, `pdjax.sweep`, `pdjax.plan`, ...) parse flags and
call these; nothing here imports a command.
"""
