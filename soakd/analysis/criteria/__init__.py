"""The built-in criteria, one module each, all with one protocol:

``judge(ctx: base.Context) -> list[CriterionResult]``: the module's results (most give one,
memory one per memory metric, gpu_devices one per extra GPU, thresholds one per
expression). ``ctx`` carries the run data, the settings, the measured window and what the
criteria judged before it (``ctx.results``, by module name), so a criterion that builds on
another (headroom on memory) reads it there. soakd.analysis.verdict composes them in its
``CRITERIA`` order; a new criterion is one module here and one line in that list
(tests/test_criteria_modules.py fails on a module missing from it). Each criterion has one
implementation for both paths: the in-memory run and the bounded one (``ctx.digest``: a
run too long to load, streamed).
"""
