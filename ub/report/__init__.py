"""``ub report``: static figures of a run, or of a folder of runs overlaid (PNG), and one
self-contained HTML page.

A run's figures, each from its tables (:mod:`ub.run.folder.views`), one module per concern:

- :mod:`ub.report.curves`, how well it plays: the learning curve per env (win rate against
  each fixed opponent with its 95% Wilson band, draws, and the random player's own rate in the
  same seats of the same games), the training games' win rate by kind of opponent, the
  exploitability (NashConv) with the random policy's, each reasoning benchmark by checkpoint;
- :mod:`ub.report.pool`: TrueSkill ratings (each checkpoint's latest mu ± sigma; mu over
  rounds for a few checkpoints, labelled) and the match matrix (saying which checkpoints it
  leaves out);
- :mod:`ub.report.health`, how it is going: invalid-move and format rates with the learner's
  probability off the legal moves, entropy, response length and truncation, the learner's
  loss, gradient norm, clip fraction, KL, learning rate and reward, and the time per round;
- :mod:`ub.report.sweep`: a folder of runs, each run's learning curve in its arm's colour and
  the arm's mean bold; invalid moves and entropy per arm.

A figure with no data yet (no evaluation, say) is left out. :mod:`ub.report.page` writes the
files; the page also has the numbers (the learning curve as a table, the run's settings, or a
sweep's arms as ``ub compare`` gives them).
"""

from ub.report.page import write_report, write_sweep_report

__all__ = ["write_report", "write_sweep_report"]
