"""The orders in which methods take turns on the same inputs, so that a side-by-side comparison is fair
(docs/design.md §5): the benchmarks' interleaved runs and a job's paired baseline records both use them."""

from __future__ import annotations


def balanced_orders(count: int) -> list[list[int]]:
    """Orders of ``count`` methods in which each method runs at each place equally often and right after
    each other method equally often (a Williams design: ``count`` orders, twice as many for an odd count above 1).

    A method runs faster in the wake of one that uses the same weights than in the wake of one that evicts
    them from the CPU's cache (demo pair, batch 1: our ``large`` 7-10% slower right after CTranslate2 than
    right after itself). Rotating one order by one at each turn keeps every method behind the same
    neighbour, so that bias never averages out; these orders spread it over all methods alike."""
    first = [0] + [(place + 1) // 2 if place % 2 else count - place // 2 for place in range(1, count)]  # 0, 1, n-1, 2, ...
    orders = [[(place + shift) % count for place in first] for shift in range(count)]
    return orders + [order[::-1] for order in orders] if count % 2 and count > 1 else orders  # one method: one order


def order_coverage(count: int, turns: int) -> str:
    """What ``turns`` turns of ``count`` methods make of balanced_orders' cycle, for a benchmark's header: the
    balance holds over whole cycles only (``bench-batch`` takes one turn per repetition, so 3 repetitions of 6
    cells run half a cycle; ``bench`` one per input and repetition, so one partial cycle among many whole ones)."""
    cycle = len(balanced_orders(count))
    full, rest = divmod(turns, cycle)
    whole = f"{_counted(full, 'full cycle')} of {_counted(cycle, 'turn')}"
    if not rest:
        return f"balanced orders, {whole}"
    if not full:
        return f"balanced orders, {rest} of a cycle's {cycle} turns: not fully balanced"
    return f"balanced orders, {whole} and {_counted(rest, 'turn')} more: not fully balanced"


def _counted(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
