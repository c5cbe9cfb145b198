"""A chi-square goodness-of-fit statistic for tests that check sampled tokens against a distribution."""

import numpy as np

CHI2_DF5_P001 = 20.52  # chi-square critical value, 5 degrees of freedom, p = 0.001


def chi2(counts: np.ndarray, p: np.ndarray) -> float:
    """Pearson's statistic of `counts` against probabilities `p`; a token of probability 0 fails at once."""
    n = counts.sum()
    m = p > 0
    assert counts[~m].sum() == 0, "sampled a token of probability 0"
    exp = n * p[m]
    return float(((counts[m] - exp) ** 2 / exp).sum())
