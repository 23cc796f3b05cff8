"""The orders in which methods take turns on the same inputs, so that a side-by-side comparison is fair
(DESIGN.md §5): the benchmarks' interleaved runs and a job's paired baseline records both use them."""

from __future__ import annotations


def balanced_orders(count: int) -> list[list[int]]:
    """Orders of ``count`` methods in which each method runs at each place equally often and right after
    each other method equally often (a Williams design: ``count`` orders, twice as many for an odd count).

    A method runs faster in the wake of one that uses the same weights than in the wake of one that evicts
    them from the CPU's cache (demo pair, batch 1: our ``large`` 7-10% slower right after CTranslate2 than
    right after itself). Rotating one order by one at each turn keeps every method behind the same
    neighbour, so that bias never averages out; these orders spread it over all methods alike."""
    first = [0] + [(place + 1) // 2 if place % 2 else count - place // 2 for place in range(1, count)]  # 0, 1, n-1, 2, ...
    orders = [[(place + shift) % count for place in first] for shift in range(count)]
    return orders + [order[::-1] for order in orders] if count % 2 else orders
