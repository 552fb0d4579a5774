"""Compiled kernels behind the rules and pre-aggregators, one module per topic (each
imports numba and torch; a rule imports the ones it needs in its ``aggregate``):

* ``networks``: sorting networks for the coordinate-wise rules (median, trimmed mean,
  mean around the median);
* ``gram``: pairwise distances from one float64 Gram matrix;
* ``reductions``: row norms, weighted sums and group means, accumulated in float64;
* ``subsets``: exhaustive searches over the subsets of rows (MDA, SMEA);
* ``threads``: the thread pool that splits large inputs into column chunks.
"""
