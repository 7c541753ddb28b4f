"""Pairwise (all-pairs) selection of test cases: every pair of values of any two factors appears
in some case, so the GPU suite covers every two-way interaction with far fewer cases than the full
product."""

import itertools
import random


def pairwise(factors, seed=0):
    """Rows covering every pair of values of any two factors (greedy, reproducible)."""
    names = list(factors)
    uncovered = {((a, x), (b, y))
                 for a, b in itertools.combinations(names, 2)
                 for x in range(len(factors[a])) for y in range(len(factors[b]))}
    rng = random.Random(seed)
    rows = []
    while uncovered:
        best, best_gain = None, -1
        pool = sorted(uncovered)
        for _ in range(60):
            # Seed each candidate from an uncovered pair so that every round makes progress.
            (a, x), (b, y) = rng.choice(pool)
            row = {n: rng.randrange(len(factors[n])) for n in names}
            row[a], row[b] = x, y
            gain = sum(((p, row[p]), (q, row[q])) in uncovered
                       for p, q in itertools.combinations(names, 2))
            if gain > best_gain:
                best, best_gain = row, gain
        uncovered -= {((p, best[p]), (q, best[q])) for p, q in itertools.combinations(names, 2)}
        rows.append({n: factors[n][best[n]] for n in names})
    return rows
