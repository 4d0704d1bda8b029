"""What ``hps serve`` runs, beside and around tritonserver.

- :mod:`hps.triton.supervisor.serve`: the run, from a ps.json to a serving tritonserver and
  back (drain, stop);
- :mod:`hps.triton.supervisor.server`: one tritonserver child process;
- :mod:`hps.triton.supervisor.install`: where tritonserver comes from, ``hps install-triton``;
- :mod:`hps.triton.supervisor.gate`: the request-size gate (nginx) in front of it;
  :mod:`hps.triton.supervisor.gate_log`: the counts of its error log ``hps serve`` shows;
- :mod:`hps.triton.supervisor.serve_lock`: one ``hps serve`` per state dir;
- :mod:`hps.triton.supervisor.lifecycle`: children that die with their parent, and what a
  dead predecessor left, cleaned up;
- :mod:`hps.triton.supervisor.orphan_guard`: a process that kills Triton and the gate if
  they outlive ``hps serve`` by its grace;
- :mod:`hps.triton.supervisor.output`: what ``hps serve`` shows of Triton's output;
- :mod:`hps.triton.supervisor.watchdog`: reloads a model whose stub died.

It talks to Triton through :mod:`hps.triton.client` and imports nothing of the model
process (:mod:`hps.triton.model`; ``tests/unit/test_layers.py``).
"""
